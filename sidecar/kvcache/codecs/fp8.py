"""`fp8`: OCP e4m3 (`float8_e4m3fn`) with one scale per token, layer and K|V.

The scale maps the largest magnitude of a row's rotated values to 448, e4m3's largest finite value, so the
format's full dynamic range is used and nothing saturates.
"""

from __future__ import annotations

import torch

from .fixed import ElementFormat, FixedWidthCodec, table_lookup

E4M3_MAX = 448.0
E4M3_VALUES = tuple(torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float().tolist())
"""Value of every byte (NaN for 0x7F and 0xFF); a lookup beats torch's fp8 cast 2x on CPU."""


def _quantize(values: torch.Tensor) -> torch.Tensor:
    clipped = values.clamp(-E4M3_MAX, E4M3_MAX)
    return clipped.to(torch.float8_e4m3fn).view(torch.uint8)


FP8 = FixedWidthCodec(
    "fp8",
    ElementFormat(8, E4M3_MAX, _quantize, lambda data: table_lookup(E4M3_VALUES, data)),
)
