"""`fp16`: the exact IEEE half-precision cast, 2 bytes per element, little-endian."""

from __future__ import annotations

import torch

from .fixed import ElementFormat, FixedWidthCodec, finite_cast

FP16 = FixedWidthCodec(
    "fp16",
    ElementFormat(
        bits=16,
        qmax=None,
        quantize=lambda values: finite_cast(values, torch.float16),
        dequantize=lambda data: data.view(torch.float16),
    ),
)
