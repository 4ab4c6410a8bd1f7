"""The fixed-width codecs: exact test vectors, error bounds, token independence, bad input."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.kvcache.codecs import CODEC_NAMES, get_codec
from sidecar.kvcache.codecs.fixed import FixedWidthCodec
from sidecar.kvcache.errors import PayloadError, TablesError, TensorError, UnknownCodecError
from sidecar.kvcache.layout import KVLayout

FIXED = ("fp16", "bf16", "fp8", "int8", "fp4", "int4")
TINY = KVLayout(num_layers=1, num_kv_heads=1, head_dim=4)
TINY_KV = torch.tensor([[[[[0.5, -1.0, 3.0, 0.0]]], [[[1.5, 2.0, -6.0, 0.25]]]]])

# The test vectors of docs/wire-format.md: TINY_KV (K = 0.5 -1 3 0, V = 1.5 2 -6 0.25).
VECTORS = {
    "fp16": "01003800bc00420000003e004000c60034",
    "bf16": "01003f80bf40400000c03f0040c0c0803e",
    "fp8": "01db1edb2269f17e006e71fe59",
    "int8": "010c260c2a15d67f00202a8105",
    "fp4": "010038003cc207430f",
    "int4": "01db36db3ae1072209",
}


def kv_like(layout: KVLayout, tokens: int, seed: int = 0) -> torch.Tensor:
    """Gaussian KV with a few large channels, as real K caches have."""
    generator = torch.Generator().manual_seed(seed)
    kv = torch.randn(layout.shape(tokens), generator=generator)
    kv[..., 0] *= 20
    return kv


def error_bound(name: str, kv: torch.Tensor) -> torch.Tensor:
    """Largest |error| each element may have, from the format's step at its magnitude."""
    magnitude = kv.abs()
    if name == "fp16":
        return magnitude * 2.0**-11 + 2.0**-25
    if name == "bf16":
        return magnitude * 2.0**-8
    qmax = {"fp8": 448.0, "int8": 127.0, "fp4": 6.0, "int4": 7.0}[name]
    scale = magnitude.amax(dim=(-2, -1), keepdim=True) / qmax * (1 + 2.0**-10)
    bounds = {
        "fp8": torch.maximum(magnitude / 16, scale / 1024),
        "int8": scale / 2,
        "fp4": torch.maximum(magnitude / 4, scale / 4),
        "int4": scale / 2,
    }
    return bounds[name] * (1 + 2.0**-9) + 1e-30


@pytest.mark.parametrize("name", FIXED)
def test_vectors(name: str) -> None:
    codec = get_codec(name)
    (payload,) = codec.encode(TINY_KV, TINY)
    assert payload.hex() == VECTORS[name]
    decoded = codec.decode([bytes.fromhex(VECTORS[name])], TINY)
    assert torch.all((decoded.float() - TINY_KV).abs() <= error_bound(name, TINY_KV))


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
    assert torch.all((decoded - kv.float()).abs() <= error_bound(name, kv.float()))


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
    scales = 0 if bits == 16 else 30 * 2 * 2
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
    for bad in (payload[:-1], payload + b"\x00", b"", b"\x02" + payload[1:]):
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
        ("fp8", 5, b"\x7f"),  # e4m3 NaN; elements start after version and two scales
        ("int8", 5, b"\x80"),  # -128
        ("int4", 5, b"\x08"),  # nibble -8
        ("fp8", 2, b"\xfc"),  # negative scale
        ("int8", 1, b"\x00\x7c"),  # scale +Inf
    ],
)
def test_codes_the_encoder_never_emits_are_rejected(name: str, offset: int, byte: bytes) -> None:
    (payload,) = get_codec(name).encode(TINY_KV, TINY)
    corrupt = payload[:offset] + byte + payload[offset + len(byte) :]
    with pytest.raises(PayloadError):
        get_codec(name).decode([corrupt], TINY)


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
    magnitude=st.floats(1e-3, 1e3),
    seed=st.integers(0, 2**16),
)
def test_random_layouts_round_trip(
    name: str, layers: int, heads: int, head_dim: int, tokens: int, magnitude: float, seed: int
) -> None:
    layout = KVLayout(layers, heads, head_dim, dtype="float32")
    kv = kv_like(layout, tokens, seed) * magnitude
    codec = get_codec(name)
    decoded = codec.decode(codec.encode(kv, layout), layout)
    assert torch.all((decoded - kv).abs() <= error_bound(name, kv))


@settings(max_examples=100, deadline=None)
@given(name=st.sampled_from(FIXED), data=st.data())
def test_arbitrary_bytes_decode_or_raise_payload_error(name: str, data: st.DataObject) -> None:
    codec = get_codec(name)
    assert isinstance(codec, FixedWidthCodec)
    size = codec.payload_size(TINY)
    payload = data.draw(st.binary(min_size=size - 1, max_size=size))
    try:
        decoded = codec.decode([b"\x01" + payload[1:]], TINY)
    except PayloadError:
        return
    assert decoded.shape == TINY.shape(1)
    assert bool(torch.isfinite(decoded).all())
