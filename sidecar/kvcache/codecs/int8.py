"""`int8`: symmetric integers in [-127, 127] with one scale per token, layer and K|V.

-128 is never emitted, so zero is exactly representable and a payload holding it is corrupt.
"""

from __future__ import annotations

import torch

from .fixed import ElementFormat, FixedWidthCodec, integer_codes

INT8_MAX = 127


def _quantize(values: torch.Tensor) -> torch.Tensor:
    # Scaled values exceed 127 by at most the fp16 rounding of the scale (< 0.1), so the
    # rounded value fits int8 before the (cheaper) integer clamp.
    return values.round_().to(torch.int8).clamp_(-INT8_MAX, INT8_MAX).view(torch.uint8)


INT8 = FixedWidthCodec(
    "int8",
    ElementFormat(
        8, float(INT8_MAX), _quantize, lambda data: integer_codes(data.view(torch.int8), -128)
    ),
)
