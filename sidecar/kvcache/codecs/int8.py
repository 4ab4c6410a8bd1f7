"""`int8`: symmetric integers in [-127, 127] with one scale per token, layer and K|V.

-128 is never emitted, so zero is exactly representable and a payload holding it is corrupt.
"""

from __future__ import annotations

import torch

from .fixed import ElementFormat, FixedWidthCodec

INT8_MAX = 127.0


def _quantize(values: torch.Tensor) -> torch.Tensor:
    return values.round().clamp(-INT8_MAX, INT8_MAX).to(torch.int8).view(torch.uint8)


def _dequantize(data: torch.Tensor) -> torch.Tensor:
    values = data.view(torch.int8).float()
    return values.masked_fill_(values == -128, float("nan"))


INT8 = FixedWidthCodec("int8", ElementFormat(8, INT8_MAX, _quantize, _dequantize))
