"""`bf16`: the bbfloat16 cast (round to nearest even), 2 bytes per element, little-endian."""

from __future__ import annotations

import torch

from .fixed import ElementFormat, FixedWidthCodec, finite_cast

BF16 = FixedWidthCodec(
    "bf16",
    ElementFormat(
        bits=16,
        qmax=None,
        quantize=lambda values: finite_cast(values, torch.bfloat16),
        dequantize=lambda data: data.view(torch.bfloat16),
    ),
)
