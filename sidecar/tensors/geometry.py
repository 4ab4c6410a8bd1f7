"""Bounds of a strided view, checked before any memory is mapped.

A handle's shape and strides come from another process; a view that reaches past its
memory would read or write someone else's bytes (or fault the sidecar), and a view whose
elements overlap would let one loaded token overwrite another. Both are refused here with
the numbers that were wrong.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from sidecar.kvcache.layout import DTYPES

from .errors import InvalidHandle

MAX_DIMS = 8
MAX_VIEW_BYTES = 1 << 38
"""256 GiB: no single KV buffer is larger; bounds every size before arithmetic trusts it."""


def handle_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise InvalidHandle(f"dtype must be one of {sorted(DTYPES)}, got {name!r}") from None


def check_bytes(name: str, value: int, *, minimum: int = 0) -> None:
    if not minimum <= value <= MAX_VIEW_BYTES:
        raise InvalidHandle(f"{name} must be in [{minimum}, {MAX_VIEW_BYTES}], got {value}")


def check_view(
    dtype: torch.dtype,
    shape: Sequence[int],
    stride: Sequence[int],
    *,
    offset_elements: int,
    capacity_bytes: int,
) -> None:
    """Refuse a view that is empty, overlaps itself, or ends past `capacity_bytes`.

    `offset_elements` is where element 0 sits, in elements from the start of the capacity.
    """
    if not 1 <= len(shape) <= MAX_DIMS:
        raise InvalidHandle(f"shape must have 1 to {MAX_DIMS} dimensions, got {len(shape)}")
    if len(stride) != len(shape):
        raise InvalidHandle(f"shape {tuple(shape)} has {len(stride)} strides")
    itemsize = dtype.itemsize
    limit = MAX_VIEW_BYTES // itemsize
    if any(not 1 <= size <= limit for size in shape):
        raise InvalidHandle(f"every dimension must be in [1, {limit}], got shape {tuple(shape)}")
    if any(not 0 <= step <= limit for step in stride):
        raise InvalidHandle(f"every stride must be in [0, {limit}], got {tuple(stride)}")
    _check_no_overlap(shape, stride)
    last = offset_elements + sum(
        (size - 1) * step for size, step in zip(shape, stride, strict=True)
    )
    end = (last + 1) * itemsize
    if end > capacity_bytes:
        raise InvalidHandle(
            f"a {dtype} view of shape {tuple(shape)}, stride {tuple(stride)} at element"
            f" {offset_elements} ends at byte {end}, past the {capacity_bytes} bytes it names"
        )


def _check_no_overlap(shape: Sequence[int], stride: Sequence[int]) -> None:
    """Each dimension (by increasing stride) must step past everything the smaller ones span.

    Sufficient for distinct elements at distinct addresses, and true of every layout a
    model server really uses (contiguous, permuted, sliced, paged).
    """
    spanned = 0
    for size, step in sorted(
        ((size, step) for size, step in zip(shape, stride, strict=True) if size > 1),
        key=lambda d: d[1],
    ):
        if step <= spanned:
            raise InvalidHandle(
                f"shape {tuple(shape)} with stride {tuple(stride)} maps two elements to one address"
            )
        spanned += (size - 1) * step
