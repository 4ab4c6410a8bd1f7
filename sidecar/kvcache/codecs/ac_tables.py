"""The `ac` codec's shared tables: quantization bins and symbol models of one prompt.

CacheGen rebuilds a 16-bit CDF per (K|V, layer, channel) for every chunk and ships it with the
chunk; on real KV those tables cost as much as the payload. Here the tables travel once, in
the prompt's catalog, and are fitted on whatever sample of the prompt exists when the catalog
is published (typically the first chunk). 128 tokens are too few to estimate 11k channel
histograms, and K's statistics drift as RoPE rotates its channel pairs with position, so a
channel's own histogram predicts later tokens badly. What does carry over is a channel's
spread: channels are grouped by (K|V, bins, RMS bucket) and each group shares one symmetric
model pooled over its channels. For K the RMS of a rotary pair `(d, d + head_dim/2)` is used:
the pair's energy is invariant under rotation while each channel's is not. Sharing models
also makes coding fast (one constriction call per model per token, not one per channel).

How channels are grouped is the fitter's choice; the format only records the result, so the
decoder needs no knowledge of RoPE.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import torch

from ..errors import TablesError
from ..layout import KVLayout, chunk_ranges
from .base import token_major
from .binning import DEFAULT_LEVEL, LEVELS, centers, check_bins, level_bins, quantize

MAGIC = b"KVAC"
TABLES_VERSION = 1
PRECISION_BITS = 16
FREQUENCY_TOTAL = 1 << PRECISION_BITS
MAX_MODELS = 255
RMS_BUCKETS = 16
SMOOTHING = 0.02
"""Pseudo-count per symbol and channel, so symbols the sample never saw stay affordable."""

FIT_SLICE_TOKENS = 256
_HEADER = struct.Struct("<4sBBHHHBB")


@dataclass(frozen=True, eq=False)
class ACTables:
    """Bins per (layer, K|V), model index per (layer, K|V, channel), frequencies per model.

    `frequencies[m, s]` is symbol `s`'s probability under model `m` in units of 2^-16; every
    entry is at least 1 (any symbol stays encodable) and each row sums to exactly 2^16.
    """

    layout: KVLayout
    level: int
    bins: torch.Tensor
    model_of: torch.Tensor
    frequencies: torch.Tensor

    @property
    def num_models(self) -> int:
        return self.frequencies.shape[0]

    @property
    def alphabet(self) -> int:
        return self.frequencies.shape[1]

    def to_bytes(self) -> bytes:
        layout = self.layout
        header = _HEADER.pack(
            MAGIC,
            TABLES_VERSION,
            self.level,
            layout.num_layers,
            layout.num_kv_heads,
            layout.head_dim,
            self.alphabet,
            self.num_models,
        )
        body = (
            self.bins.to(torch.uint8).numpy().tobytes()
            + self.model_of.to(torch.uint8).numpy().tobytes()
            + self.frequencies.numpy().astype("<u2").tobytes()
        )
        return header + body

    @classmethod
    def from_bytes(cls, layout: KVLayout, data: bytes) -> ACTables:
        """Parse and validate tables for `layout`; every inconsistency is a `TablesError`."""
        if not isinstance(data, (bytes, bytearray)):
            raise TablesError(f"ac tables must be bytes, got {type(data).__name__}")
        if len(data) < _HEADER.size:
            raise TablesError(f"ac tables truncated: {len(data)} bytes")
        magic, version, level, layers, heads, head_dim, alphabet, models = _HEADER.unpack_from(data)
        if magic != MAGIC or version != TABLES_VERSION:
            raise TablesError(f"not ac tables of version {TABLES_VERSION}: {magic!r} v{version}")
        if (layers, heads, head_dim) != (layout.num_layers, layout.num_kv_heads, layout.head_dim):
            raise TablesError(
                f"tables are for {layers} layers x {heads} heads x {head_dim}, not {layout}"
            )
        if not 1 <= models <= MAX_MODELS or not 3 <= alphabet <= 63:
            raise TablesError(f"tables declare {models} models over {alphabet} symbols")
        if level not in (0, *LEVELS):
            raise TablesError(f"tables declare an unknown level {level}")
        rows = layout.num_layers * 2
        channels = rows * layout.channels
        expected = _HEADER.size + rows + channels + 2 * models * alphabet
        if len(data) != expected:
            raise TablesError(f"ac tables have {len(data)} bytes, the header implies {expected}")
        raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        bins = raw[_HEADER.size : _HEADER.size + rows].view(layout.num_layers, 2).clone()
        model_of = raw[_HEADER.size + rows : _HEADER.size + rows + channels].clone()
        frequencies = (
            raw[_HEADER.size + rows + channels :].view(torch.int16).to(torch.int32) & 0xFFFF
        ).view(models, alphabet)
        tables = cls(layout, level, bins, model_of, frequencies)
        tables.validate()
        return tables

    def validate(self) -> None:
        check_bins(self.bins, self.layout)
        if int(self.bins.max()) - 1 > self.alphabet:
            raise TablesError(f"bins {int(self.bins.max())} exceed the alphabet {self.alphabet}")
        if int(self.model_of.max()) >= self.num_models:
            raise TablesError("a channel refers to a model the tables do not hold")
        if bool((self.frequencies < 1).any()):
            raise TablesError("a model gives a symbol zero frequency")
        if bool((self.frequencies.sum(dim=1) != FREQUENCY_TOTAL).any()):
            raise TablesError(f"a model's frequencies do not sum to {FREQUENCY_TOTAL}")


def fit_tables(
    layout: KVLayout,
    sample: torch.Tensor,
    level: int = DEFAULT_LEVEL,
    bins: torch.Tensor | None = None,
) -> ACTables:
    """Tables for a prompt from any sample of its KV `[L, 2, S, H, D]` (S >= 1).

    `bins` (uint8 `[L, 2]`) replaces the level's allocation; the tables then record level 0.
    """
    tokens = layout.check(sample)
    if tokens == 0:
        raise TablesError("cannot fit ac tables on an empty sample")
    if bins is None:
        bins = level_bins(layout.num_layers, level)
    else:
        check_bins(bins, layout)
        level = 0
    alphabet = int(bins.max()) - 1
    counts = symbol_counts(sample, layout, bins, alphabet)
    center = centers(bins).view(layout.num_layers, 2, 1, 1)
    offsets = torch.arange(alphabet).view(1, 1, 1, -1) - center
    mean_square = (counts * offsets.square()).sum(-1) / tokens
    if layout.head_dim % 2 == 0:
        pairs = mean_square[:, 0].reshape(layout.num_layers, layout.num_kv_heads, 2, -1)
        mean_square[:, 0] = pairs.mean(dim=2, keepdim=True).expand_as(pairs).flatten(1)
    log_rms = mean_square.clamp_min(1e-3).log()

    # A model per (K|V, bins, RMS bucket); buckets span each group's own log-RMS range.
    group = torch.arange(2).view(1, 2, 1) * (MAX_MODELS + 1) + bins.long().unsqueeze(-1)
    group = group.expand_as(log_rms)
    keys = torch.empty_like(group)
    for value in group.unique():
        members = group == value
        low, high = log_rms[members].min(), log_rms[members].max()
        bucket = ((log_rms[members] - low) / (high - low + 1e-9) * RMS_BUCKETS).long()
        keys[members] = value * RMS_BUCKETS + bucket.clamp(max=RMS_BUCKETS - 1)
    unique_keys, model_of = keys.flatten().unique(return_inverse=True)

    # Pooled counts, mirrored around zero: K and V are symmetric in the long run.
    valid = offsets.abs() <= center
    mirror = (center - offsets).clamp(0, alphabet - 1).expand_as(counts)
    symmetric = 0.5 * (counts + counts.gather(3, mirror)) * valid
    prior = (SMOOTHING * valid).expand_as(counts)
    pooled = torch.zeros(unique_keys.numel(), alphabet)
    pooled.index_add_(0, model_of, (symmetric + prior).reshape(-1, alphabet))
    return ACTables(layout, level, bins, model_of.to(torch.uint8), to_frequencies(pooled))


def symbol_counts(
    sample: torch.Tensor, layout: KVLayout, bins: torch.Tensor, alphabet: int
) -> torch.Tensor:
    """Histogram `[L, 2, C, alphabet]` of the sample's symbols, in bounded memory."""
    rows = layout.num_layers * 2 * layout.channels
    base = torch.arange(rows) * alphabet
    counts = torch.zeros(rows * alphabet)
    for span in chunk_ranges(sample.shape[2], FIT_SLICE_TOKENS):
        part = token_major(sample[:, :, span.start : span.stop], layout)
        symbols, _ = quantize(part, bins.to(sample.device))
        flat = symbols.cpu().view(len(span), rows) + base
        counts += torch.bincount(flat.flatten(), minlength=rows * alphabet)
    return counts.view(layout.num_layers, 2, layout.channels, alphabet)


def to_frequencies(weights: torch.Tensor) -> torch.Tensor:
    """Rows of non-negative weights as integer frequencies >= 1 summing to 2^16 each."""
    alphabet = weights.shape[1]
    shares = weights / weights.sum(dim=1, keepdim=True)
    frequencies = (shares * (FREQUENCY_TOTAL - alphabet)).floor().to(torch.int32) + 1
    remainder = FREQUENCY_TOTAL - frequencies.sum(dim=1)
    frequencies[torch.arange(weights.shape[0]), frequencies.argmax(dim=1)] += remainder
    return frequencies
