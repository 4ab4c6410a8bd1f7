"""`fp4`: OCP e2m1 (sign, 2 exponent bits, 1 mantissa bit), two elements a byte.

One scale per token, layer and K|V maps the row's largest rotated magnitude to 6, e2m1's
largest value.
(A scale per head, as int4 has, measured no better: e2m1's levels are dense near zero, where
a quiet head's values fall.)
"""

from __future__ import annotations

import functools

import torch

from .fixed import (
    ElementFormat,
    FixedWidthCodec,
    nearest_codes_by_top_bits,
    nibble_pair_lookup,
    top_bits_index,
)

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
    """Round to the nearest e2m1 value, ties away from zero, by a lookup on each float32's top
    16 bits (`nearest_codes_by_top_bits`: every midpoint between e2m1 values has at most 3
    significant bits) instead of arithmetic.

    Even and odd elements go through two tables, the odd one's codes already in the high
    nibble, so the lookups pack the bytes too. Three passes over the values instead of twelve:
    fp4's encoder ran at 350-380 MB/s with the arithmetic, the slowest of the 4-bit tracks.
    """
    index = top_bits_index(values)
    low, high = _nibble_tables(values.device)
    packed = torch.index_select(low, 0, index[:, 0::2].reshape(-1))
    packed |= torch.index_select(high, 0, index[:, 1::2].reshape(-1))
    return packed.view(values.shape[0], -1)


@functools.cache
def _nibble_tables(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The e2m1 code of every float32 by its top 16 bits: low nibble, and shifted high."""
    codes = nearest_codes_by_top_bits(E2M1_VALUES[:8], 3, device)
    return codes, codes << 4


FP4 = FixedWidthCodec(
    "fp4",
    ElementFormat(4, E2M1_MAX, _quantize, lambda data: nibble_pair_lookup(E2M1_VALUES, data)),
)
