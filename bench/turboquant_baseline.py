"""TurboQuant as PyPI's `turboquant` ships it, as a baseline for the fixed-width tracks and `ac`.

TurboQuant_MSE (Zandieh et al., 2025), what the package's KV cache uses: each head vector
keeps its float32 norm, and the unit vector, rotated by a random orthogonal matrix (the
package's, seed 42), has each coordinate replaced by the nearest of 2^b centroids fitted to
the rotated coordinates' Beta distribution. A chunk really is serialised (the b-bit indices
packed, the norms as float32, as the package's `compute_memory_bytes` counts them: b + 32 /
head_dim bits per element) and parsed back, so sizes are bytes on the wire and the KV is a
true round trip. The package's cache also keeps the most recent 128 tokens exact; the bench
measures it as served like every track, its context's most recent chunk on int8.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import numpy as np
import torch

from bench.compression import Compression
from sidecar.kvcache.layout import KVLayout

BITS = (2, 3, 4)
"""The widths compared: the package's 2, 3 and 4 bits per coordinate."""
SEED = 42
"""The package cache's own rotation seed."""


@functools.cache
def _quantizer(head_dim: int, bits: int) -> object:
    from turboquant.core import TurboQuantMSE

    with _trapz_for_numpy_2():
        return TurboQuantMSE(dim=head_dim, bits=bits, device="cpu", seed=SEED)


@contextlib.contextmanager
def _trapz_for_numpy_2() -> Iterator[None]:
    """turboquant 0.2.0 fits its codebook with `np.trapz`, which numpy 2 removed for
    `np.trapezoid` (the same integral): lend it the old name while it fits, and only then."""
    if hasattr(np, "trapz"):
        yield
        return
    np.trapz = np.trapezoid  # type: ignore[attr-defined]
    try:
        yield
    finally:
        del np.trapz  # type: ignore[attr-defined]


def _pack(indices: np.ndarray, bits: int) -> bytes:
    """Each index's low `bits` bits, most significant first, packed without gaps."""
    spread = np.unpackbits(indices[..., None], axis=-1)[..., 8 - bits :]
    return np.packbits(spread.reshape(-1)).tobytes()


def _unpack(data: bytes, count: int, bits: int) -> np.ndarray:
    spread = np.unpackbits(np.frombuffer(data, dtype=np.uint8))[: count * bits]
    weights = (1 << np.arange(bits - 1, -1, -1)).astype(np.uint8)
    return (spread.reshape(count, bits) * weights).sum(axis=1).astype(np.uint8)


def encode_chunk(kv: torch.Tensor, layout: KVLayout, bits: int) -> bytes:
    """One chunk `[layers, 2, tokens, kv_heads, head_dim]`: the norms (float32), then the
    packed indices, head vector by head vector."""
    quantizer = _quantizer(layout.head_dim, bits)
    indices, norms = quantizer.quantize(kv.float().reshape(-1, layout.head_dim))  # type: ignore[attr-defined]
    packed = _pack(indices.numpy(), bits)
    return norms.reshape(-1).numpy().astype("<f4").tobytes() + packed


def decode_chunk(blob: bytes, layout: KVLayout, bits: int) -> torch.Tensor:
    per_vector = 4 + layout.head_dim * bits // 8
    vectors_per_token = layout.num_layers * 2 * layout.num_kv_heads
    vectors, leftover = divmod(len(blob), per_vector)
    tokens = vectors // vectors_per_token
    if leftover or tokens * vectors_per_token != vectors:
        raise ValueError(f"a TurboQuant chunk of {len(blob)} bytes is no whole token")
    norms = torch.from_numpy(np.frombuffer(blob[: 4 * vectors], dtype="<f4").copy())
    indices = _unpack(blob[4 * vectors :], vectors * layout.head_dim, bits)
    quantizer = _quantizer(layout.head_dim, bits)
    restored = quantizer.dequantize(  # type: ignore[attr-defined]
        torch.from_numpy(indices).reshape(vectors, layout.head_dim), norms.reshape(-1, 1)
    )
    return restored.reshape(layout.shape(tokens)).to(layout.torch_dtype)


def compression(layout: KVLayout, bits: int) -> Compression:
    return Compression(
        name=f"turboquant {bits}-bit",
        fit=lambda sample: None,
        encode=lambda chunk, tables: [encode_chunk(chunk, layout, bits)],
        decode=lambda blobs, tables: torch.cat(
            [decode_chunk(blob, layout, bits) for blob in blobs], dim=2
        ),
    )
