"""The `ac` codec: format vectors, shared tables, per-token decodability, hostile input."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.kvcache.codecs import get_codec
from sidecar.kvcache.codecs.ac import ACCodec
from sidecar.kvcache.codecs.ac_tables import ACTables, fit_tables, to_frequencies
from sidecar.kvcache.codecs.base import PAYLOAD_VERSION
from sidecar.kvcache.codecs.binning import centers, level_bins
from sidecar.kvcache.errors import PayloadError, TablesError, TensorError
from sidecar.kvcache.layout import KVLayout

AC = get_codec("ac")
TINY = KVLayout(num_layers=1, num_kv_heads=1, head_dim=4)
TINY_KV = torch.tensor([[[[[0.5, -1.0, 1.0, 0.0]]], [[[2.0, 0.0, -2.0, 0.4]]]]])
# docs/wire-format.md: 4 bins for K and V, channels 0-1 on model 0, 2-3 on model 1.
TINY_TABLES = ACTables(
    TINY,
    level=0,
    bins=torch.tensor([[4, 4]], dtype=torch.uint8),
    model_of=torch.tensor([0, 0, 1, 1, 0, 0, 1, 1], dtype=torch.uint8),
    frequencies=torch.tensor([[16384, 32768, 16384], [8192, 49152, 8192]], dtype=torch.int32),
)
TABLES_VECTOR = "4b5641430100010001000400030204040000010100000101004000800040002000c00020"
PAYLOAD_VECTOR = "03003c0040790280c602000000"
LAYOUT = KVLayout(num_layers=4, num_kv_heads=2, head_dim=8, dtype="float32")


def kv_like(layout: KVLayout, tokens: int, seed: int = 0) -> torch.Tensor:
    """Gaussian KV with per-channel spreads and a large channel, like real caches."""
    generator = torch.Generator().manual_seed(seed)
    spread = torch.rand(
        layout.num_layers, 2, 1, layout.num_kv_heads, layout.head_dim, generator=generator
    )
    kv = torch.randn(layout.shape(tokens), generator=generator) * (0.2 + 2 * spread)
    kv[:, 0, :, :, 0] *= 8
    return kv


def step(kv: torch.Tensor, layout: KVLayout, level: int = 2) -> torch.Tensor:
    """Half a quantization step per element: the most `ac` may be off by."""
    maxima = kv.abs().amax(dim=(-2, -1), keepdim=True)
    levels = centers(level_bins(layout.num_layers, level)).view(layout.num_layers, 2, 1, 1, 1)
    return maxima / levels / 2 * (1 + 2.0**-9) + 1e-30


def test_tables_vector() -> None:
    TINY_TABLES.validate()
    assert TINY_TABLES.to_bytes().hex() == TABLES_VECTOR
    parsed = ACTables.from_bytes(TINY, bytes.fromhex(TABLES_VECTOR))
    assert torch.equal(parsed.frequencies, TINY_TABLES.frequencies)
    assert torch.equal(parsed.model_of, TINY_TABLES.model_of)


def test_payload_vector() -> None:
    tables = bytes.fromhex(TABLES_VECTOR)
    (payload,) = AC.encode(TINY_KV, TINY, tables)
    assert payload[0] == PAYLOAD_VERSION == 3
    assert payload.hex() == PAYLOAD_VECTOR
    decoded = AC.decode([bytes.fromhex(PAYLOAD_VECTOR)], TINY, tables)
    # 4 bins: levels -m, 0, m; 0.5 is a tie and rounds to even (0), 0.4 rounds to 0.
    assert decoded.flatten().tolist() == [0.0, -1.0, 1.0, 0.0, 2.0, 0.0, -2.0, 0.0]
    text = (Path(__file__).parents[2] / "docs" / "wire-format.md").read_text()
    section = text[text.index("### `ac` payload") : text.index("## Shared AC tables")]
    assert PAYLOAD_VECTOR in "".join(section.split())


@pytest.mark.parametrize("level", [1, 2, 3])
def test_tables_fitted_on_the_first_chunk_serve_the_whole_prompt(level: int) -> None:
    codec = ACCodec(level)
    kv = kv_like(LAYOUT, 300)
    tables = codec.fit_tables(LAYOUT, kv[:, :, :128])
    assert ACTables.from_bytes(LAYOUT, tables).to_bytes() == tables
    decoded = torch.cat(
        [
            codec.decode(
                codec.encode(kv[:, :, start : start + 128], LAYOUT, tables), LAYOUT, tables
            )
            for start in range(0, 300, 128)
        ],
        dim=2,
    )
    assert torch.all((decoded.float() - kv).abs() <= step(kv, LAYOUT, level))


def test_entropy_coding_beats_the_raw_symbol_width() -> None:
    kv = kv_like(LAYOUT, 256, seed=3)
    tables = AC.fit_tables(LAYOUT, kv[:, :, :128])
    payloads = AC.encode(kv[:, :, 128:], LAYOUT, tables)
    header = 1 + 2 * LAYOUT.num_layers * 2
    coded_bits = sum(8 * (len(p) - header) for p in payloads) / (128 * LAYOUT.elements_per_token)
    bins = level_bins(LAYOUT.num_layers).float()
    raw_bits = (bins - 1).log2().mean().item()
    assert coded_bits < raw_bits - 0.5


def test_each_token_decodes_alone_and_into_a_strided_view() -> None:
    layout = KVLayout(2, 2, 8, dtype="float16")
    kv = kv_like(layout, 7, seed=2)
    tables = AC.fit_tables(layout, kv)
    payloads = AC.encode(kv, layout, tables)
    whole = AC.decode(payloads, layout, tables)
    assert whole.dtype == torch.float16
    for index in range(7):
        alone = AC.decode([payloads[index]], layout, tables)
        assert torch.equal(alone, whole[:, :, index : index + 1])
    cache = torch.zeros(layout.shape(12), dtype=torch.float16)
    AC.decode(payloads[1:4], layout, tables, out=cache[:, :, 5:8])
    assert torch.equal(cache[:, :, 5:8], whole[:, :, 1:4])
    assert not cache[:, :, :5].any() and not cache[:, :, 8:].any()


def test_tables_with_bins_of_the_fitters_choice_record_level_0_and_decode() -> None:
    bins = torch.tensor([[40, 8], [6, 4], [64, 10], [12, 12]], dtype=torch.uint8)
    kv = kv_like(LAYOUT, 16, seed=3)
    tables = fit_tables(LAYOUT, kv, bins=bins)
    assert tables.level == 0 and torch.equal(tables.bins, bins)
    data = tables.to_bytes()
    restored = AC.decode(AC.encode(kv, LAYOUT, data), LAYOUT, data)
    step = kv.abs().amax(dim=(3, 4), keepdim=True) / (bins.view(4, 2, 1, 1, 1) // 2 - 1)
    assert torch.all((restored - kv).abs() <= step * (0.5 + 2.0**-9))
    with pytest.raises(TablesError):
        fit_tables(LAYOUT, kv, bins=torch.full((4, 2), 65, dtype=torch.uint8))


def test_missing_foreign_and_corrupt_tables_are_rejected() -> None:
    tables = AC.fit_tables(LAYOUT, kv_like(LAYOUT, 16))
    kv = kv_like(LAYOUT, 2)
    with pytest.raises(TablesError):
        AC.encode(kv, LAYOUT, None)
    with pytest.raises(TablesError):
        AC.encode(kv_like(TINY, 2), TINY, tables)
    with pytest.raises(TablesError):
        AC.fit_tables(LAYOUT, kv[:, :, :0])
    header_end = 14 + 2 * LAYOUT.num_layers
    corruptions = {
        "magic": b"XVAC" + tables[4:],
        "version": tables[:4] + b"\x02" + tables[5:],
        "level": tables[:5] + b"\x09" + tables[6:],
        "truncated": tables[:-1],
        "overlong": tables + b"\x00",
        "odd bins": tables[:14] + b"\x05" + tables[15:],
        "model index": tables[: header_end + 3] + b"\xfe" + tables[header_end + 4 :],
        "frequency sum": tables[:-2] + b"\x00\x00",
        "not bytes": tables.decode("latin-1"),
    }
    for name, bad in corruptions.items():
        with pytest.raises(TablesError):
            AC.decode(AC.encode(kv, LAYOUT, tables), LAYOUT, bad)  # type: ignore[arg-type]
        assert name


def test_to_frequencies_keeps_every_symbol_and_the_total() -> None:
    frequencies = to_frequencies(torch.tensor([[0.0, 1.0, 0.0], [1e-9, 5.0, 3.0], [1.0, 1.0, 1.0]]))
    assert bool((frequencies >= 1).all())
    assert frequencies.sum(dim=1).tolist() == [65536, 65536, 65536]


def test_non_finite_and_misshapen_input_is_rejected() -> None:
    tables = AC.fit_tables(LAYOUT, kv_like(LAYOUT, 16))
    for bad in (float("nan"), float("inf")):
        kv = kv_like(LAYOUT, 3)
        kv[2, 1, 1, 0, 3] = bad
        with pytest.raises(TensorError):
            AC.encode(kv, LAYOUT, tables)
        with pytest.raises(TensorError):
            AC.fit_tables(LAYOUT, kv)
    with pytest.raises(TensorError):
        AC.encode(kv_like(KVLayout(4, 2, 4), 3), LAYOUT, tables)


def test_truncated_and_corrupt_payloads_are_rejected() -> None:
    kv = kv_like(LAYOUT, 8, seed=5)
    tables = AC.fit_tables(LAYOUT, kv)
    payloads = AC.encode(kv, LAYOUT, tables)
    payload = payloads[3]
    header = 1 + 2 * LAYOUT.num_layers * 2
    bad_payloads = [
        payload[:-4],
        payload[:-1],
        payload[: header + 4],
        payload + b"\x01\x00\x00\x00",
        payload[:header] + b"\x00" * (len(payload) - header),
        payload[:header] + bytes(b ^ 0xFF for b in payload[header:]),
        b"\x00" + payload[1:],
        b"\x01" + payload[1:],  # the version before the fixed-width formats rotated
        bytes([PAYLOAD_VERSION + 1]) + payload[1:],
        payload[:1] + b"\x00\xfc" + payload[3:],  # a negative maximum
        payload[:header] + b"\xff" * 4 * 400,  # beyond any possible length
    ]
    for index, bad in enumerate(bad_payloads):
        with pytest.raises(PayloadError):
            AC.decode([payloads[0], bad], LAYOUT, tables)
        assert index >= 0


@settings(max_examples=25, deadline=None)
@given(
    layers=st.integers(1, 12),
    heads=st.integers(1, 3),
    head_dim=st.integers(1, 10),
    tokens=st.integers(1, 6),
    level=st.sampled_from([1, 2, 3]),
    magnitude=st.floats(1e-3, 1e3),
    seed=st.integers(0, 2**16),
)
def test_random_layouts_round_trip(
    layers: int, heads: int, head_dim: int, tokens: int, level: int, magnitude: float, seed: int
) -> None:
    layout = KVLayout(layers, heads, head_dim, dtype="float32")
    codec = ACCodec(level)
    kv = kv_like(layout, tokens, seed) * magnitude
    tables = codec.fit_tables(layout, kv[:, :, :1])
    decoded = codec.decode(codec.encode(kv, layout, tables), layout, tables)
    assert torch.all((decoded - kv).abs() <= step(kv, layout, level))


FUZZ_TABLES = AC.fit_tables(LAYOUT, kv_like(LAYOUT, 32, seed=9))


@settings(max_examples=200, deadline=None)
@given(data=st.binary(min_size=0, max_size=600))
def test_arbitrary_bytes_decode_or_raise_payload_error(data: bytes) -> None:
    header = bytes([PAYLOAD_VERSION]) + b"\x00\x3c" * (LAYOUT.num_layers * 2)  # maxima 1.0
    for payload, bound in ((data, float("inf")), (header + data, 1.0)):
        try:
            decoded = AC.decode([payload], LAYOUT, FUZZ_TABLES)
        except PayloadError:
            continue
        assert decoded.shape == LAYOUT.shape(1)
        assert bool(decoded.abs().le(bound).all())
