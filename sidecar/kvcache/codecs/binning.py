"""CacheGen's layer-wise quantization: symbols for the entropy coder, and back.

Each (token, layer, K|V) row of `H*D` values is scaled by its largest magnitude `m` and
rounded onto `bins - 1` symmetric levels, `q = round(x * MAX / m) + MAX` with
`MAX = bins / 2 - 1`, exactly as CacheGen ships it; `m` travels with the token as fp16 and
the encoder quantizes with that rounded value, so the decoder's `x = (q - MAX) * m / MAX`
sees the same scale.

How many bins each layer gets is where the two differ. CacheGen gives early layers more
(`cachegen_bins`). Measured on SmolLM2 (KL of the next 1024 tokens), that spends bits where
they buy least: quantizing only layers 0-9 at CacheGen's level 2 costs KL 0.0015, layers
10-19 cost 0.017 and 20-29 0.010, and K hurts twice as much as V. Rate-distortion says to
equalise those contributions, so kvmoq's levels (`level_bins`) split the depth into thirds
and give the middle third of K the most bins: level 2 reaches KL 0.028 at 2.40 bit/element
where CacheGen's bins need 2.75 for KL 0.029. Any allocation decodes: bins travel in the
tables.
"""

from __future__ import annotations

import torch

from ..errors import TablesError, TensorError
from ..layout import KVLayout
from .base import all_finite

LEVELS = (1, 2, 3)
DEFAULT_LEVEL = 2
MIN_BINS = 4
MAX_BINS = 64
SMALLEST_MAXIMUM = 2.0**-24


LEVEL_BINS: dict[int, tuple[tuple[int, int, int], tuple[int, int, int]]] = {
    1: ((12, 20, 14), (8, 14, 10)),
    2: ((14, 24, 16), (10, 16, 12)),
    3: ((20, 32, 24), (14, 24, 16)),
}
"""Bins of K and of V for the first, middle and last third of the layers, per level."""

CACHEGEN_LEVELS = {1: (16, 12, 20, 2), 2: (32, 16, 10, 2), 3: (32, 32, 0, 0)}
"""CacheGen's QUANT_LEVEL: (fine bins, coarse bins, K layers that are fine, V layers)."""


def _check_level(level: int) -> None:
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")


def level_bins(num_layers: int, level: int = DEFAULT_LEVEL) -> torch.Tensor:
    """kvmoq's bins per (layer, K|V) as uint8 `[L, 2]` for a quality level."""
    _check_level(level)
    third = torch.arange(num_layers) * 3 // num_layers
    keys, values = (torch.tensor(bins)[third] for bins in LEVEL_BINS[level])
    return torch.stack((keys, values), dim=1).to(torch.uint8)


def cachegen_bins(num_layers: int, level: int = DEFAULT_LEVEL) -> torch.Tensor:
    """CacheGen's bins per (layer, K|V) as uint8 `[L, 2]` (its level 2 is LMCache's default).

    Level 1: K 16 below layer 20 then 12, V 16 below layer 2 then 12.
    Level 2: K 32 below layer 10 then 16, V 32 below layer 2 then 16.
    Level 3: 32 everywhere.
    """
    _check_level(level)
    fine, coarse, k_depth, v_depth = CACHEGEN_LEVELS[level]
    layer = torch.arange(num_layers)
    keys = torch.where(layer < k_depth, fine, coarse)
    values = torch.where(layer < v_depth, fine, coarse)
    return torch.stack((keys, values), dim=1).to(torch.uint8)


def centers(bins: torch.Tensor) -> torch.Tensor:
    """`MAX` of each (layer, K|V): the symbol of zero, and the largest |q - MAX|."""
    return (bins.long() // 2 - 1).to(torch.int32)


def quantize(tokens: torch.Tensor, bins: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symbols int32 `[T, L, 2, C]` and fp16 maxima `[T, L, 2]` of token-major KV.

    Raises `TensorError` when a row holds NaN/Inf or a magnitude fp16 cannot carry.
    """
    maxima = tokens.abs().amax(dim=-1).to(torch.float16)
    if not all_finite(maxima):
        raise TensorError("KV contains NaN/Inf or magnitudes beyond the fp16 range of the maxima")
    center = centers(bins).to(tokens.device)
    factor = center / maxima.float().clamp_min(SMALLEST_MAXIMUM)
    scaled = tokens.float() * factor.unsqueeze(-1)
    scaled.round_().add_(center.unsqueeze(-1))
    scaled = torch.minimum(scaled.clamp_(min=0), (2 * center).unsqueeze(-1).float())
    return scaled.to(torch.int32), maxima


def dequantize(symbols: torch.Tensor, maxima: torch.Tensor, bins: torch.Tensor) -> torch.Tensor:
    """float32 `[T, L, 2, C]` from symbols and maxima (inverse of `quantize` up to rounding)."""
    center = centers(bins).to(symbols.device).float()
    step = maxima.float() / center
    # In place on the float copy: symbols may be uint8, where `symbols - center` would wrap.
    return symbols.float().sub_(center.unsqueeze(-1)).mul_(step.unsqueeze(-1))


def check_bins(bins: torch.Tensor, layout: KVLayout) -> None:
    """Bins fit the layout and the coder: an even count in [MIN_BINS, MAX_BINS] per row."""
    if tuple(bins.shape) != (layout.num_layers, 2):
        raise TablesError(f"bins must be [{layout.num_layers}, 2], got {tuple(bins.shape)}")
    if bool(((bins < MIN_BINS) | (bins > MAX_BINS) | (bins % 2 != 0)).any()):
        raise TablesError(f"bins must be even and within [{MIN_BINS}, {MAX_BINS}]")
