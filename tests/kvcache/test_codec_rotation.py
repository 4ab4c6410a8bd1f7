"""The Walsh-Hadamard rotation the scaled fixed-width codecs quantize in."""

from __future__ import annotations

import math

import pytest
import torch

from sidecar.kvcache.codecs import get_codec
from sidecar.kvcache.codecs.rotation import block_size, rotate, rotate_scaled
from sidecar.kvcache.layout import KVLayout


def sylvester(size: int) -> torch.Tensor:
    """The normalised Sylvester Hadamard matrix, built independently of `rotation.py`."""
    matrix = torch.ones(1, 1, dtype=torch.float64)
    base = torch.tensor([[1.0, 1.0], [1.0, -1.0]], dtype=torch.float64)
    while matrix.shape[0] < size:
        matrix = torch.kron(base, matrix)
    return matrix / math.sqrt(size)


@pytest.mark.parametrize(
    ("head_dim", "block"),
    [(1, 1), (2, 2), (3, 1), (6, 2), (12, 4), (64, 64), (80, 16), (96, 32), (128, 128)],
)
def test_block_is_the_largest_power_of_two_dividing_head_dim(head_dim: int, block: int) -> None:
    assert block_size(head_dim) == block


def test_block_of_four_is_half_the_sylvester_matrix() -> None:
    h4 = [[1, 1, 1, 1], [1, -1, 1, -1], [1, 1, -1, -1], [1, -1, -1, 1]]
    assert torch.equal(rotate(torch.eye(4), 4), torch.tensor(h4, dtype=torch.float32) / 2)
    # docs/wire-format.md: the K of the test vectors.
    assert rotate(torch.tensor([0.5, -1.0, 3.0, 0.0]), 4).tolist() == [1.25, 2.25, -1.75, -0.75]


@pytest.mark.parametrize("head_dim", [1, 2, 4, 6, 8, 64, 80, 128])
def test_rotation_is_orthonormal_and_its_own_inverse(head_dim: int) -> None:
    generator = torch.Generator().manual_seed(head_dim)
    values = torch.rand(5, 3, 2 * head_dim, generator=generator) * 2 - 1
    rotated = rotate(values, head_dim)
    assert rotated.shape == values.shape and rotated.dtype == torch.float32
    block = block_size(head_dim)
    expected = (values.double().reshape(-1, block) @ sylvester(block)).view(values.shape)
    assert torch.allclose(rotated.double(), expected, rtol=0, atol=1e-6)
    if block > 1:
        assert not torch.allclose(rotated, values)
    assert (rotate(rotated, head_dim) - values).abs().max() <= 1e-6
    # Norm kept per block, so per head and per row too.
    norms = values.reshape(-1, block).norm(dim=-1)
    assert torch.allclose(rotated.reshape(-1, block).norm(dim=-1), norms, rtol=1e-6, atol=0)


@pytest.mark.parametrize("head_dim", [4, 6, 64, 80, 128])
def test_the_decoders_rotation_is_the_scaled_levels_rotated_rounded_once(head_dim: int) -> None:
    """`rotate_scaled` (int8 codes through the integer product, the same codes as float32
    through the float one) gives the same bytes on both paths, the scaled levels' rotation
    within two float32 roundings (the sums are exact; the scale times the norm, and that
    times a sum, are rounded), where scaling first and rotating in float32 rounds at every
    addition."""
    generator = torch.Generator().manual_seed(head_dim)
    tokens, groups, per_group = 3, 4, 2 * head_dim
    codes = torch.randint(-127, 128, (tokens, groups * per_group), generator=generator)
    scales = (torch.rand(tokens, groups, generator=generator) + 2.0**-14).half()
    integer = rotate_scaled(codes.to(torch.int8), scales, head_dim)
    floating = rotate_scaled(codes.float(), scales, head_dim)
    assert integer.dtype == floating.dtype == torch.float32
    assert torch.equal(integer, floating)
    block = block_size(head_dim)
    signs = (sylvester(block) * math.sqrt(block)).round()
    sums = (codes.double().reshape(-1, block) @ signs).view(tokens, groups, -1)
    exact = (sums * scales.double().unsqueeze(-1) / math.sqrt(block)).view(tokens, -1)
    assert ((integer.double() - exact).abs() <= exact.abs() * 2.0**-22).all()


def test_blocks_never_straddle_heads() -> None:
    # head_dim 12, block 4: a value in one block leaves every other block untouched.
    values = torch.zeros(2 * 12)
    values[5] = 1.0
    rotated = rotate(values, 12)
    assert torch.equal(rotated[4:8], torch.tensor([0.5, -0.5, 0.5, -0.5]))
    assert not rotated[:4].any() and not rotated[8:].any()


@pytest.mark.parametrize("name", ["fp8", "int8", "fp4", "int4"])
def test_encoding_gives_the_same_bytes_whatever_the_threads_or_the_memory_offset(
    name: str,
) -> None:
    """A publisher re-encodes a lazy track when it is first asked for, and the bytes must
    match the digests its catalog already published (transfer/publisher.py)."""
    layout = KVLayout(4, 3, 64, dtype="float16")
    generator = torch.Generator().manual_seed(7)
    kv = (torch.randn(layout.shape(128), generator=generator) * 3).half()
    kv[..., 5] *= 40  # an outlier channel, as real K has
    codec = get_codec(name)
    reference = codec.encode(kv, layout)
    threads = torch.get_num_threads()
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            assert codec.encode(kv.clone(), layout) == reference
            # The same values at another offset in memory, and as a strided slice.
            padded = torch.zeros(kv.numel() + 3, dtype=kv.dtype)
            padded[3:] = kv.flatten()
            assert codec.encode(padded[3:].view(kv.shape), layout) == reference
            wider = torch.zeros(layout.shape(256), dtype=kv.dtype)
            wider[:, :, 64:192] = kv
            assert codec.encode(wider[:, :, 64:192], layout) == reference
    finally:
        torch.set_num_threads(threads)


def butterfly(values: torch.Tensor, block: int) -> torch.Tensor:
    """The block Hadamard product as the fast Walsh-Hadamard transform: the same sums as a
    matrix product, added in another order, in float64."""
    rows = values.double().reshape(-1, block)
    half = 1
    while half < block:
        pairs = rows.view(-1, block // (2 * half), 2, half)
        first, second = pairs[:, :, 0], pairs[:, :, 1]
        rows = torch.stack((first + second, first - second), dim=2).reshape(-1, block)
        half *= 2
    return (rows * (1 / math.sqrt(block))).float().view(values.shape)


def test_the_encoders_rotation_is_the_same_whatever_the_order_of_its_sums() -> None:
    """fp16 values from 2^-24 to 2^15 in one block: float32 sums lose the small ones, in an
    order each library (and each GPU kernel) picks; the encoder's sums are exact, so a chunk
    codes to the same bytes on every device."""
    generator = torch.Generator().manual_seed(3)
    shape = (64, 2, 128)
    exponents = torch.randint(-24, 15, shape, generator=generator).double()
    signs = torch.randint(0, 2, shape, generator=generator).double() * 2 - 1
    fractions = 1 + torch.rand(shape, generator=generator, dtype=torch.float64)
    values = (signs * fractions * 2.0**exponents).half().float()
    exact = rotate(values, 128, exact=True)
    assert torch.equal(exact, butterfly(values, 128))
    assert not torch.equal(rotate(values, 128), exact)  # the data does tell the orders apart
