"""`int8`: symmetric integers in [-127, 127] with one scale per token, layer and K|V.

-128 is never emitted, so zero is exactly representable and a payload holding it is corrupt.
"""

from __future__ import annotations

import torch

from .fixed import ElementFormat, FixedWidthCodec

INT8_MAX = 127


def _quantize(values: torch.Tensor) -> torch.Tensor:
    # Scaled values exceed 127 by at most the fp16 rounding of the scale (< 0.1), so the
    # rounded value fits int8 before the (cheaper) integer clamp.
    return values.round_().to(torch.int8).clamp_(-INT8_MAX, INT8_MAX).view(torch.uint8)


def _dequantize(data: torch.Tensor) -> torch.Tensor:
    codes = data.view(torch.int8)
    values = codes.float()
    # One reduction over the bytes finds a -128; only a corrupt payload pays for the mask
    # (which took longer than the rest of the decode).
    if int(codes.min()) == -128:
        values.masked_fill_(codes == -128, float("nan"))
    return values


INT8 = FixedWidthCodec("int8", ElementFormat(8, float(INT8_MAX), _quantize, _dequantize))
