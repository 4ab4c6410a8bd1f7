"""`int4`: symmetric integers in [-7, 7], two's-complement nibbles, two elements a byte.

One scale per token, layer, K|V and head; the nibble 0b1000 (-8) is never emitted.
"""

from __future__ import annotations

import torch

from .fixed import ElementFormat, FixedWidthCodec, integer_codes, pack_nibbles, unpack_nibbles

INT4_MAX = 7


def _quantize(values: torch.Tensor) -> torch.Tensor:
    # Clamped after the cast: scaled values exceed 7 by at most the fp16 rounding of the
    # scale, and an int8 clamp is a quarter of the memory traffic of a float one.
    codes = values.round_().to(torch.int8).clamp_(-INT4_MAX, INT4_MAX).view(torch.uint8) & 0x0F
    return pack_nibbles(codes)


def _dequantize(data: torch.Tensor) -> torch.Tensor:
    nibbles = unpack_nibbles(data).to(torch.int8)
    return integer_codes((nibbles ^ 8).sub_(8), never=-8)  # two's complement of 4 bits


INT4 = FixedWidthCodec(
    "int4", ElementFormat(4, float(INT4_MAX), _quantize, _dequantize), per_head_scales=True
)
