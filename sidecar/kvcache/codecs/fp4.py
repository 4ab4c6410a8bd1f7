"""`fp4`: OCP e2m1 (sign, 2 exponent bits, 1 mantissa bit), two elements a byte.

One scale per token, layer and K|V maps the row's largest rotated magnitude to 6, e2m1's
largest value.
(A scale per head, as int4 has, measured no better: e2m1's levels are dense near zero, where
a quiet head's values fall.)
"""

from __future__ import annotations

import torch

from .fixed import ElementFormat, FixedWidthCodec, nibble_pair_lookup, pack_nibbles

E2M1_MAX = 6.0
E2M1_VALUES = (
    0.0,
    0.5,
    1.0,
    1.5,
    2.0,
    3.0,
    4.0,
    6.0,
    -0.0,
    -0.5,
    -1.0,
    -1.5,
    -2.0,
    -3.0,
    -4.0,
    -6.0,
)
"""Value of each code: bit 3 is the sign, bits 0-2 the magnitude's index."""


def _quantize(values: torch.Tensor) -> torch.Tensor:
    """Round to the nearest e2m1 value, ties to even, without a lookup or a search.

    The magnitudes' grid has steps 0.5, 1 and 2 below 2, 4 and 6, so the piecewise-linear
    map `a + min(a, 2) - max(a - 4, 0) / 2` sends it onto the integers 0..7 (the codes) and
    one `round` (half to even) does the job; bucketize is 30x slower on CPU. Scaled values
    never exceed 6 by more than the fp16 rounding of the scale, which still rounds to code 7.
    """
    magnitude = values.abs()
    position = magnitude.clamp(max=2).add_(magnitude)
    position.sub_(magnitude.clamp_(min=4).sub_(4), alpha=0.5)
    codes = position.round_().to(torch.uint8)
    codes |= (values < 0).to(torch.uint8) << 3
    return pack_nibbles(codes)


FP4 = FixedWidthCodec(
    "fp4",
    ElementFormat(4, E2M1_MAX, _quantize, lambda data: nibble_pair_lookup(E2M1_VALUES, data)),
)
