"""The fixed-width codecs: exact test vectors, error bounds, token independence, bad input."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.kvcache.codecs import CODEC_NAMES, get_codec
from sidecar.kvcache.codecs.base import PAYLOAD_VERSION
from sidecar.kvcache.codecs.fixed import FixedWidthCodec
from sidecar.kvcache.codecs.fp4 import E2M1_VALUES, FP4
from sidecar.kvcache.codecs.fp8 import E3M4_MAGNITUDES, FP8
from sidecar.kvcache.errors import PayloadError, TablesError, TensorError, UnknownCodecError
from sidecar.kvcache.layout import KVLayout

FIXED = ("fp16", "bf16", "fp8", "int8", "fp4", "int4")
SCALED = ("fp8", "int8", "fp4", "int4")
QMAX = {"fp8": 31.0, "int8": 127.0, "fp4": 6.0, "int4": 7.0}
PER_HEAD_SCALES = {"fp8": False, "int8": False, "fp4": False, "int4": True}
TINY = KVLayout(num_layers=1, num_kv_heads=1, head_dim=4)
TINY_KV = torch.tensor([[[[[0.5, -1.0, 3.0, 0.0]]], [[[1.5, 2.0, -6.0, 0.25]]]]])

# The test vectors of docs/wire-format.md: TINY_KV (K = 0.5 -1 3 0, V = 1.5 2 -6 0.25);
# the scaled formats quantize the rotated K = 1.25 2.25 -1.75 -0.75, V = -1.125 -3.375 4.625 2.875.
VECTORS = {
    "fp16": "03003800bc00420000003e004000c60034",
    "bf16": "03003f80bf40400000c03f0040c0c0803e",
    "fp8": "03a52cc630717ff8e5def77f73",
    "int8": "038924a928477f9dd6e1a37f4f",
    "fp4": "0300362b3a75ceeb67",
    "int4": "032535493974ebbe47",
}
# What each vector decodes to in TINY's float16: (K, V).
DECODED = {
    "fp16": ([0.5, -1.0, 3.0, 0.0], [1.5, 2.0, -6.0, 0.25]),
    "bf16": ([0.5, -1.0, 3.0, 0.0], [1.5, 2.0, -6.0, 0.25]),
    "fp8": (
        [0.48974609375, -0.998046875, 2.994140625, -0.0181427001953125],
        [1.4541015625, 2.05078125, -6.00390625, 0.260986328125],
    ),
    "int8": (
        [0.5048828125, -1.0009765625, 3.001953125, 0.00885772705078125],
        [1.4931640625, 2.001953125, -6.0078125, 0.2548828125],
    ),
    "fp4": ([0.5625, -0.9375, 2.8125, -0.1875], [1.734375, 1.734375, -5.9765625, 0.1927490234375]),
    "int4": (
        [0.64306640625, -0.96484375, 2.89453125, 0.0],
        [1.3212890625, 1.982421875, -5.9453125, 0.0],
    ),
}


def kv_like(layout: KVLayout, tokens: int, seed: int = 0) -> torch.Tensor:
    """Gaussian KV with a few large channels and heads of different sizes, as real caches have."""
    generator = torch.Generator().manual_seed(seed)
    kv = torch.randn(layout.shape(tokens), generator=generator)
    kv[..., 0] *= 20
    return kv * 4.0 ** -torch.arange(layout.num_kv_heads).view(-1, 1)


def hadamard_rotate(values: torch.Tensor) -> torch.Tensor:
    """The wire format's rotation of each head (the last dim), in float64, from its definition:
    the head's values in blocks of the largest power of two dividing D, each block times the
    normalised Sylvester matrix."""
    head_dim = values.shape[-1]
    block = head_dim & -head_dim
    matrix = torch.ones(1, 1, dtype=torch.float64)
    while matrix.shape[0] < block:
        matrix = torch.cat((torch.cat((matrix, matrix), 1), torch.cat((matrix, -matrix), 1)))
    rotated = values.double().reshape(-1, block) @ (matrix / math.sqrt(block))
    return rotated.view(values.shape)


def cast_error_bound(name: str, kv: torch.Tensor) -> torch.Tensor:
    """Largest |error| of each element of an exact cast: half a step at its magnitude."""
    magnitude = kv.abs()
    if name == "fp16":
        return magnitude * 2.0**-11 + 2.0**-25
    return magnitude * 2.0**-8


def element_error_bound(name: str, rotated: torch.Tensor) -> torch.Tensor:
    """Largest |error| of each rotated value `[L, 2, T, H, D]` of a scaled format: the format's
    step at its magnitude, for the scale of its group (row or head), rounded up to fp16
    (relative 2^-11), and never below the smallest normal fp16, 2^-14, where the codecs
    floor it."""
    magnitude = rotated.abs()
    group = (-1,) if PER_HEAD_SCALES[name] else (-2, -1)
    largest = magnitude.amax(dim=group, keepdim=True)
    scale = (largest / QMAX[name] * (1 + 2.0**-10)).clamp_min(2.0**-14)
    bounds = {
        "fp8": torch.maximum(magnitude / 32, scale / 128),
        "int8": scale / 2,
        "fp4": torch.maximum(magnitude / 4, scale / 4),
        "int4": scale / 2,
    }
    return bounds[name] * (1 + 2.0**-9) + 1e-30


def assert_within_format_error(name: str, kv: torch.Tensor, decoded: torch.Tensor) -> None:
    """Exact casts: each element within half a step. Scaled formats quantize the rotated
    values, and the rotation is orthonormal, so the error is bounded element by element in the
    rotated domain (not in the decoded one, where each element's error mixes the block's)."""
    kv, decoded = kv.double(), decoded.double()
    if name not in SCALED:
        assert torch.all((decoded - kv).abs() <= cast_error_bound(name, kv))
        return
    rotated = hadamard_rotate(kv)
    # Slack for the float32 arithmetic of the two rotations (a few ulps of the head's values).
    block = kv.shape[-1] & -kv.shape[-1]
    slack = rotated.abs().amax(dim=-1, keepdim=True) * block * 2.0**-20
    error = (hadamard_rotate(decoded) - rotated).abs()
    assert torch.all(error <= element_error_bound(name, rotated) + slack)


@pytest.mark.parametrize("name", FIXED)
def test_vectors(name: str) -> None:
    codec = get_codec(name)
    (payload,) = codec.encode(TINY_KV, TINY)
    assert payload[0] == PAYLOAD_VERSION == 3
    assert payload.hex() == VECTORS[name]
    decoded = codec.decode([bytes.fromhex(VECTORS[name])], TINY)
    assert (decoded[0, 0].flatten().tolist(), decoded[0, 1].flatten().tolist()) == DECODED[name]
    exact = codec.decode([payload], KVLayout(1, 1, 4, dtype="float32"))
    assert_within_format_error(name, TINY_KV, exact)


def test_documented_vectors_match() -> None:
    text = (Path(__file__).parents[2] / "docs" / "wire-format.md").read_text()
    section = text[text.index("### Fixed-width payloads") : text.index("### `ac` payload")]
    rows = re.findall(r"^\| (\w+) +\| `([0-9a-f ]+)` \|$", section, re.MULTILINE)
    assert {name: hex_.replace(" ", "") for name, hex_ in rows} == VECTORS


def test_registry() -> None:
    assert set(FIXED) < set(CODEC_NAMES)
    for name in FIXED:
        assert get_codec(name).name == name
    with pytest.raises(UnknownCodecError):
        get_codec("zstd")


@pytest.mark.parametrize("name", FIXED)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_round_trip_within_format_error(name: str, dtype: torch.dtype) -> None:
    layout = KVLayout(3, 2, 8, dtype="float32")
    kv = kv_like(layout, 9).to(dtype)
    codec = get_codec(name)
    payloads = codec.encode(kv, layout)
    assert len(payloads) == 9
    assert {len(p) for p in payloads} == {codec.payload_size(layout)}
    decoded = codec.decode(payloads, layout)
    assert decoded.dtype == torch.float32
    assert_within_format_error(name, kv, decoded)


def test_int4_round_trips_a_head_dim_that_is_not_a_power_of_two() -> None:
    layout = KVLayout(2, 3, 80, dtype="float32")  # rotation blocks of 16, five per head
    kv = kv_like(layout, 4, seed=3)
    codec = get_codec("int4")
    assert codec.payload_size(layout) == 1 + 4 * 2 * 3 + 2 * 2 * 240 // 2
    assert_within_format_error("int4", kv, codec.decode(codec.encode(kv, layout), layout))


@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_casts_are_exact_on_their_own_dtype(name: str) -> None:
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[name]
    layout = KVLayout(2, 3, 4, dtype={"fp16": "float16", "bf16": "bfloat16"}[name])
    kv = kv_like(layout, 5).to(dtype)
    codec = get_codec(name)
    assert torch.equal(codec.decode(codec.encode(kv, layout), layout), kv)


@pytest.mark.parametrize("name", FIXED)
def test_payload_sizes(name: str) -> None:
    layout = KVLayout(30, 3, 64)
    bits = {"fp16": 16, "bf16": 16, "fp8": 8, "int8": 8, "fp4": 4, "int4": 4}[name]
    # One f16 scale per (layer, K|V); per (layer, K|V, head) for int4.
    scales = 0 if bits == 16 else 2 * 30 * 2 * (3 if name == "int4" else 1)
    codec = get_codec(name)
    assert isinstance(codec, FixedWidthCodec)
    assert codec.payload_size(layout) == 1 + scales + 30 * 2 * 192 * bits // 8


@pytest.mark.parametrize("name", FIXED)
def test_each_token_decodes_alone_and_into_a_strided_view(name: str) -> None:
    layout = KVLayout(2, 2, 4, dtype="float16")
    kv = kv_like(layout, 6, seed=1)
    codec = get_codec(name)
    payloads = codec.encode(kv, layout)
    whole = codec.decode(payloads, layout)
    for index in range(6):
        assert torch.equal(codec.decode([payloads[index]], layout), whole[:, :, index : index + 1])
    cache = torch.zeros(layout.shape(10), dtype=torch.float16)
    returned = codec.decode(payloads[2:5], layout, out=cache[:, :, 4:7])
    assert torch.equal(cache[:, :, 4:7], whole[:, :, 2:5])
    assert returned.data_ptr() == cache[:, :, 4:7].data_ptr()
    assert not cache[:, :, :4].any() and not cache[:, :, 7:].any()


@pytest.mark.parametrize("name", FIXED)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_input_is_rejected(name: str, bad: float) -> None:
    kv = TINY_KV.clone()
    kv[0, 1, 0, 0, 2] = bad
    with pytest.raises(TensorError):
        get_codec(name).encode(kv, TINY)


@pytest.mark.parametrize("name", ["fp16", "fp8", "int8", "int4"])
def test_values_beyond_the_format_are_rejected(name: str) -> None:
    kv = TINY_KV * 1e9
    with pytest.raises(TensorError):
        get_codec(name).encode(kv, TINY)


@pytest.mark.parametrize("name", FIXED)
def test_shape_mismatch_and_tables_are_rejected(name: str) -> None:
    codec = get_codec(name)
    with pytest.raises(TensorError):
        codec.encode(TINY_KV, KVLayout(1, 1, 8))
    with pytest.raises(TensorError):
        codec.encode(TINY_KV.to(torch.int32), TINY)
    with pytest.raises(TablesError):
        codec.encode(TINY_KV, TINY, b"\x01")
    assert codec.fit_tables(TINY, TINY_KV) is None


@pytest.mark.parametrize("name", FIXED)
def test_truncated_overlong_and_versionless_payloads(name: str) -> None:
    codec = get_codec(name)
    (payload,) = codec.encode(TINY_KV, TINY)
    codec.decode([payload], TINY)
    wrong_versions = [bytes([v]) + payload[1:] for v in (0, 1, PAYLOAD_VERSION + 1, 255)]
    for bad in (payload[:-1], payload + b"\x00", b"", *wrong_versions):
        with pytest.raises(PayloadError):
            codec.decode([payload, bad], TINY)
    for container in (payload, [], [payload.hex()]):
        with pytest.raises(PayloadError):
            codec.decode(container, TINY)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "offset", "byte"),
    [
        ("fp16", 1, b"\x00\x7e"),  # element 0 becomes NaN
        ("bf16", 1, b"\x80\xff"),  # -Inf
        ("int8", 5, b"\x80"),  # -128
        ("int4", 5, b"\x08"),  # nibble -8 (one scale per head: still 2 with one head)
        ("fp8", 2, b"\xfc"),  # negative scale
        ("int8", 1, b"\x00\x00"),  # scale 0: scales are at least 2^-14
        ("int4", 1, b"\x00\x80"),  # scale -0.0
        ("fp4", 1, b"\x01\x00"),  # subnormal scale 2^-24
        ("int8", 1, b"\x00\x7c"),  # scale +Inf
    ],
)
def test_codes_the_encoder_never_emits_are_rejected(name: str, offset: int, byte: bytes) -> None:
    (payload,) = get_codec(name).encode(TINY_KV, TINY)
    corrupt = payload[:offset] + byte + payload[offset + len(byte) :]
    with pytest.raises(PayloadError):
        get_codec(name).decode([corrupt], TINY)


def test_int4_scales_are_per_head_in_layer_kv_head_order() -> None:
    layout = KVLayout(2, 2, 4, dtype="float32")
    kv = kv_like(layout, 1, seed=4)
    codec = get_codec("int4")
    (payload,) = codec.encode(kv, layout)
    assert len(payload) == 1 + 2 * 2 * 2 * 2 + 2 * 2 * 8 // 2
    whole = codec.decode([payload], layout)
    # Shrink the scale of (layer 1, V, head 0) to the smallest one (2^-14): that head alone
    # decodes to nearly zero.
    offset = 1 + 2 * ((1 * 2 + 1) * 2 + 0)
    shrunk = codec.decode([payload[:offset] + b"\x00\x04" + payload[offset + 2 :]], layout)
    assert whole[1, 1, :, 0].abs().max() > 0.1
    assert shrunk[1, 1, :, 0].abs().max() <= 7 * 2.0**-14 * 4
    shrunk[1, 1, :, 0] = whole[1, 1, :, 0]
    assert torch.equal(shrunk, whole)


@pytest.mark.parametrize(
    ("codec", "magnitudes", "sign_bit"),
    [(FP4, E2M1_VALUES[:8], 3), (FP8, E3M4_MAGNITUDES, 7)],
    ids=["fp4-e2m1", "fp8-e3m4"],
)
def test_float_elements_round_to_the_nearest_value_ties_away_from_zero(
    codec: FixedWidthCodec, magnitudes: tuple[float, ...], sign_bit: int
) -> None:
    """The encoders' table lookup against the definition: each midpoint between neighbouring
    values, one float32 step either side of it, values past the largest as a rounded scale
    leaves them, and random values over the whole range."""
    grid = torch.tensor(magnitudes, dtype=torch.float64)
    largest = magnitudes[-1]
    midpoints = ((grid[1:] + grid[:-1]) / 2).float()
    extra = torch.tensor([largest * (1 + 2.0**-11), 1e-30, 2.0**-126])
    magnitudes_in = torch.cat(
        (
            midpoints,
            torch.nextafter(midpoints, torch.tensor(0.0)),
            torch.nextafter(midpoints, torch.tensor(2.0 * largest)),
            grid.float(),
            extra,
            torch.rand(4000, generator=torch.Generator().manual_seed(5)) * largest,
        )
    )
    values = torch.cat((magnitudes_in, -magnitudes_in))
    distance = (values.double().abs().unsqueeze(1) - grid).abs()
    # Nearest, and at a tie the larger magnitude: the last index of the smallest distance.
    nearest = grid.numel() - 1 - distance.flip(1).argmin(dim=1)
    expected = nearest.to(torch.uint8) | (torch.signbit(values).to(torch.uint8) << sign_bit)
    quantized = codec.element.quantize(values.view(1, -1).clone()).flatten()
    if codec.element.bits == 4:  # two to a byte, low nibble first
        quantized = torch.stack((quantized & 0x0F, quantized >> 4), dim=-1).flatten()
    assert torch.equal(quantized, expected)


@pytest.mark.parametrize("name", SCALED)
def test_decoding_without_the_inverse_rotation_is_not_within_bounds(name: str) -> None:
    """The bound of `assert_within_format_error` tells a decoder that forgot to rotate back."""
    layout = KVLayout(3, 2, 8, dtype="float32")
    kv = kv_like(layout, 9)
    decoded = get_codec(name).decode(get_codec(name).encode(kv, layout), layout)
    with pytest.raises(AssertionError):
        assert_within_format_error(name, kv, hadamard_rotate(decoded).float())


@pytest.mark.parametrize(
    ("name", "head_dim"), [(name, head_dim) for name in FIXED for head_dim in (4, 6, 3)]
)
def test_encode_leaves_its_input_alone(name: str, head_dim: int) -> None:
    layout = KVLayout(2, 2, head_dim, dtype="float32")
    for tokens in (3, 1):
        kv = kv_like(layout, tokens)
        before = kv.clone()
        get_codec(name).encode(kv, layout)
        assert torch.equal(kv, before), f"{tokens} tokens"


@pytest.mark.parametrize("name", SCALED)
@pytest.mark.parametrize("exponent", [-30, -24, -20, -16, -14, -12])
def test_tiny_values_keep_their_sign_and_an_absolute_error_below_the_smallest_scale(
    name: str, exponent: int
) -> None:
    """Scales never go below the smallest normal fp16 (2^-14): a subnormal scale could round
    down by a third and push `y / scale` to 1.5 QMAX, where int8's cast wraps to a negative
    code and fp4's code arithmetic reads as negative. Tiny groups get a coarser step instead."""
    layout = KVLayout(1, 1, 1, dtype="float32")  # head_dim 1: no rotation
    value = QMAX[name] * 1.49 * 2.0**exponent
    kv = torch.tensor([value, -value]).view(layout.shape(1))
    decoded = get_codec(name).decode(get_codec(name).encode(kv.clone(), layout), layout)
    assert torch.all(decoded * kv >= 0)
    assert torch.all((decoded - kv).abs() <= max(2.0**-14, value / 4))


def test_out_must_match_layout() -> None:
    codec = get_codec("int8")
    payloads = codec.encode(TINY_KV, TINY)
    with pytest.raises(TensorError):
        codec.decode(payloads, TINY, out=torch.zeros(TINY.shape(2), dtype=torch.float16))
    with pytest.raises(TensorError):
        codec.decode(payloads, TINY, out=torch.zeros(TINY.shape(1), dtype=torch.float32))


@settings(max_examples=40, deadline=None)
@given(
    name=st.sampled_from(FIXED),
    layers=st.integers(1, 4),
    heads=st.integers(1, 3),
    head_dim=st.integers(1, 9),
    tokens=st.integers(1, 5),
    magnitude=st.floats(1e-3, 1e2),  # fp16 overflows beyond: 1e3 * 20 * 3.5 sigma
    seed=st.integers(0, 2**16),
)
def test_random_layouts_round_trip(
    name: str, layers: int, heads: int, head_dim: int, tokens: int, magnitude: float, seed: int
) -> None:
    layout = KVLayout(layers, heads, head_dim, dtype="float32")
    kv = kv_like(layout, tokens, seed) * magnitude
    codec = get_codec(name)
    decoded = codec.decode(codec.encode(kv.clone(), layout), layout)
    assert_within_format_error(name, kv, decoded)


@settings(max_examples=100, deadline=None)
@given(name=st.sampled_from(FIXED), data=st.data())
def test_arbitrary_bytes_decode_or_raise_payload_error(name: str, data: st.DataObject) -> None:
    codec = get_codec(name)
    assert isinstance(codec, FixedWidthCodec)
    size = codec.payload_size(TINY)
    payload = data.draw(st.binary(min_size=size - 1, max_size=size))
    try:
        decoded = codec.decode([bytes([PAYLOAD_VERSION]) + payload[1:]], TINY)
    except PayloadError:
        return
    assert decoded.shape == TINY.shape(1)
    assert bool(torch.isfinite(decoded).all())
