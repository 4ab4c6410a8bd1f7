"""The scale-quantize-pack skeleton shared by every fixed-width compression.

A token payload is `version u8 | scales | elements`: the scales (one fp16 per layer and K|V,
absent for exact casts) followed by the token's `L * 2 * H * D` elements in `[L, 2, H, D]`
order, each `bits` wide. The compressions differ only in how one scaled element becomes bits
and back (`ElementFormat`), so that is all their modules define.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ..errors import PayloadError, TensorError
from ..layout import KVLayout
from .base import (
    PAYLOAD_VERSION,
    Codec,
    all_finite,
    check_tables_absent,
    destination,
    split_rows,
    stack_fixed,
    token_major,
    write_layer_major,
)

SCALE_DTYPE = torch.float16
SMALLEST_SCALE = 2.0**-24
"""The smallest fp16 subnormal; a token whose values are all below it quantizes to zeros."""


@dataclass(frozen=True)
class ElementFormat:
    """How scaled values become packed bytes and back, for one compression.

    `quantize` maps float32 `[T, N]` (already divided by the token's scale, so within
    `[-qmax, qmax]`) to uint8 `[T, N * bits / 8]`; `dequantize` is its inverse and returns
    NaN for codes the encoder never emits (NaN patterns, -128 in int8, ...), which the
    decoder then rejects with one finiteness check.
    `qmax` is None for exact casts, which carry no scales.
    """

    bits: int
    qmax: float | None
    quantize: Callable[[torch.Tensor], torch.Tensor]
    dequantize: Callable[[torch.Tensor], torch.Tensor]


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """4-bit codes `[T, N]` (N even) -> bytes `[T, N/2]`, element 2i in the low nibble."""
    return codes[:, 0::2] | (codes[:, 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    return torch.stack((packed & 0x0F, packed >> 4), dim=-1).flatten(-2)


def finite_cast(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Cast for the exact-cast formats; NaN, Inf and overflow all show up as non-finite."""
    cast = values.to(dtype)
    if not all_finite(cast):
        raise TensorError(f"KV holds NaN/Inf or values beyond the range of {dtype}")
    return cast.view(torch.uint8)


def table_lookup(table: tuple[float, ...], codes: torch.Tensor) -> torch.Tensor:
    """`table[codes]` as float32; entries the encoder never emits are NaN in `table`."""
    values = torch.tensor(table, dtype=torch.float32, device=codes.device)
    return torch.take(values, codes.long())


class FixedWidthCodec(Codec):
    """A compression with a fixed payload size per token: casts and scaled quantizers."""

    def __init__(self, name: str, element: ElementFormat) -> None:
        self.name = name
        self.element = element

    def scale_bytes(self, layout: KVLayout) -> int:
        return 0 if self.element.qmax is None else 2 * layout.num_layers * 2

    def payload_size(self, layout: KVLayout) -> int:
        return 1 + self.scale_bytes(layout) + layout.elements_per_token * self.element.bits // 8

    def encode(
        self, kv: torch.Tensor, layout: KVLayout, tables: bytes | None = None
    ) -> list[bytes]:
        check_tables_absent(self.name, tables)
        num_tokens = layout.check(kv)
        values = token_major(kv, layout).float()
        parts = [torch.full((num_tokens, 1), PAYLOAD_VERSION, dtype=torch.uint8, device=kv.device)]
        if self.element.qmax is not None:
            scales = (values.abs().amax(dim=-1) / self.element.qmax).to(SCALE_DTYPE)
            if not bool(torch.isfinite(scales).all()):
                raise TensorError("KV contains NaN/Inf or magnitudes beyond the fp16 scale range")
            values = values / scales.float().clamp_min(SMALLEST_SCALE).unsqueeze(-1)
            parts.append(scales.view(torch.uint8).reshape(num_tokens, -1))
        parts.append(self.element.quantize(values.reshape(num_tokens, -1)))
        return split_rows(torch.cat(parts, dim=1))

    def decode(
        self,
        payloads: Sequence[bytes],
        layout: KVLayout,
        tables: bytes | None = None,
        *,
        device: torch.device | str | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        check_tables_absent(self.name, tables)
        rows = stack_fixed(payloads, self.payload_size(layout))
        num_tokens = rows.shape[0]
        dst = destination(layout, num_tokens, device, out)
        rows = rows.to(dst.device)
        start = 1 + self.scale_bytes(layout)
        values = self.element.dequantize(
            rows[:, start:].clone(memory_format=torch.contiguous_format)
        )
        values = values.view(num_tokens, layout.num_layers, 2, layout.channels)
        if self.element.qmax is not None:
            scales = rows[:, 1:start].clone(memory_format=torch.contiguous_format).view(SCALE_DTYPE)
            if bool((scales < 0).any()):
                raise PayloadError(f"{self.name} payload carries a negative scale")
            values = values * scales.view(num_tokens, layout.num_layers, 2, 1)
        if not all_finite(values, dst.dtype):
            raise PayloadError(
                f"{self.name} payload holds NaN/Inf, codes never emitted or values beyond "
                f"{dst.dtype}"
            )
        return write_layer_major(values, layout, dst)
