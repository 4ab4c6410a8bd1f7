"""The per-prompt catalog: revisions, integrity checks, and its canonical wire form."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.kvcache.catalog import (
    MAX_CATALOG_BYTES,
    MAX_TABLES_BYTES,
    Catalog,
    CatalogError,
    ChunkIntegrityError,
    TrackEntry,
    payload_digest,
)
from sidecar.kvcache.codecs import get_codec
from sidecar.kvcache.layout import KVLayout
from sidecar.kvcache.naming import PAYLOAD_TRACKS, PromptName, prompt_id
from tests.support.vectors import (
    VECTOR_AC_CHUNK0,
    VECTOR_BYTES,
    VECTOR_INT8_CHUNK0,
    vector_catalog,
    vector_first_revision,
)

LAYOUT = KVLayout(num_layers=2, num_kv_heads=1, head_dim=4)


def test_catalog_vector() -> None:
    catalog = vector_catalog()
    assert catalog.encode() == VECTOR_BYTES
    assert Catalog.decode(VECTOR_BYTES) == catalog
    assert Catalog.decode(memoryview(bytearray(VECTOR_BYTES))) == catalog
    assert catalog.name == PromptName("demo/model", prompt_id([1, 2, 3, 4, 5], 4))
    assert catalog.ready_chunks == 1 and not catalog.complete
    assert catalog.chunk_bytes(0) == {"ac": 4, "int8": 8}


def test_payload_digest_vector() -> None:
    assert payload_digest(VECTOR_INT8_CHUNK0).hex() == (
        "cabc6726e75e59a6b0efee3a5eede44e681d62dea0634c6fca01ba5457f023ea"
    )


def test_payload_digest_sees_object_boundaries() -> None:
    assert payload_digest([b"ab", b"c"]) != payload_digest([b"a", b"bc"])
    assert payload_digest([b"", b"a"]) != payload_digest([b"a", b""])


@st.composite
def catalogs(draw: st.DrawFn) -> tuple[Catalog, list[dict[str, list[bytes]]]]:
    """A first revision and the payloads of every chunk, per track."""
    tokens = draw(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=40))
    chunk_size = draw(st.integers(1, 16))
    tracks = draw(st.lists(st.sampled_from(PAYLOAD_TRACKS), min_size=1, unique=True))
    tables = {t: draw(st.none() | st.binary(max_size=16)) for t in tracks}
    model = draw(
        st.text(
            st.characters(codec="utf-8", categories=("L", "N", "P", "S")), min_size=1, max_size=20
        )
    )
    first = Catalog.for_prompt(model, LAYOUT, tokens, tables, chunk_size)
    chunks = [
        {t: draw(st.lists(st.binary(max_size=8), min_size=n, max_size=n)) for t in tracks}
        for n in (len(first.chunk_span(i)) for i in range(len(first.chunk_hashes)))
    ]
    return first, chunks


def revisions(first: Catalog, chunks: list[dict[str, list[bytes]]]) -> list[Catalog]:
    out = [first]
    for encoded in chunks:
        out.append(out[-1].with_chunk(encoded))
    return out


@settings(max_examples=50)
@given(catalogs())
def test_every_revision_round_trips_and_verifies_its_chunks(
    case: tuple[Catalog, list[dict[str, list[bytes]]]],
) -> None:
    first, chunks = case
    for ready, catalog in enumerate(revisions(first, chunks)):
        assert Catalog.decode(catalog.encode()) == catalog
        assert catalog.ready_chunks == ready
        for index, encoded in enumerate(chunks):
            for track, payloads in encoded.items():
                if index < ready:
                    catalog.verify_chunk(track, index, payloads)
                    assert catalog.chunk_bytes(index)[track] == sum(map(len, payloads))
                else:
                    with pytest.raises(ChunkIntegrityError):
                        catalog.verify_chunk(track, index, payloads)
    assert catalog.complete


@settings(max_examples=50)
@given(catalogs(), st.data())
def test_revisions_merge_in_any_order(
    case: tuple[Catalog, list[dict[str, list[bytes]]]], data: st.DataObject
) -> None:
    all_revisions = revisions(*case)
    shuffled = data.draw(st.permutations(all_revisions))
    merged = shuffled[0]
    for revision in shuffled[1:]:
        merged = merged.merge(revision)
    assert merged == all_revisions[-1]


def test_a_revision_that_rewrites_a_digest_is_refused() -> None:
    catalog = vector_catalog()
    forged = vector_first_revision().with_chunk(
        {"int8": VECTOR_INT8_CHUNK0, "ac": [b"\x09", b"\x02", b"\x03", b"\x04"]}
    )
    with pytest.raises(CatalogError):
        catalog.merge(forged)
    complete = catalog.with_chunk({"int8": [b"\x00\x00"], "ac": [b"\x00"]})
    with pytest.raises(CatalogError):
        complete.merge(forged)


def test_a_catalog_of_another_prompt_does_not_merge() -> None:
    other = Catalog.for_prompt("demo/model", LAYOUT, [1, 2, 3, 4, 6], {"int8": None}, 4)
    with pytest.raises(CatalogError):
        vector_first_revision().merge(other)


def test_verify_chunk_names_the_chunk_and_track() -> None:
    catalog = vector_catalog()
    tampered = [b"\x01", b"\x02", b"\x03", b"\x05"]
    cases = {
        "digest": tampered,
        "size": [b"\x01", b"\x02", b"\x03", b"\x04\x00"],
        "objects": VECTOR_AC_CHUNK0[:3],
        "boundaries": [b"\x01\x02", b"", b"\x03", b"\x04"],
    }
    for payloads in cases.values():
        with pytest.raises(ChunkIntegrityError) as err:
            catalog.verify_chunk("ac", 0, payloads)
        assert (err.value.track, err.value.chunk) == ("ac", 0)
    with pytest.raises(CatalogError):
        catalog.verify_chunk("fp16", 0, VECTOR_AC_CHUNK0)


def test_chunks_of_a_real_codec_verify() -> None:
    tokens = list(range(10))
    kv = torch.randn(LAYOUT.shape(len(tokens)), generator=torch.Generator().manual_seed(0))
    int8 = get_codec("int8")
    catalog = Catalog.for_prompt("m", LAYOUT, tokens, {"int8": None}, chunk_size=8)
    encoded = [int8.encode(kv[:, :, s.start : s.stop], LAYOUT) for s in (range(8), range(8, 10))]
    for payloads in encoded:
        catalog = catalog.with_chunk({"int8": payloads})
    for index, payloads in enumerate(encoded):
        catalog.verify_chunk("int8", index, payloads)
    flipped = bytearray(encoded[1][1])
    flipped[-1] ^= 1
    with pytest.raises(ChunkIntegrityError):
        catalog.verify_chunk("int8", 1, [encoded[1][0], bytes(flipped)])


def test_with_chunk_takes_the_next_chunk_on_every_track() -> None:
    catalog = vector_catalog()
    with pytest.raises(CatalogError):
        catalog.with_chunk({"int8": [b"\x00"]})
    with pytest.raises(CatalogError):
        catalog.with_chunk({"int8": [b"\x00"] * 2, "ac": [b"\x00"] * 2})
    complete = catalog.with_chunk({"int8": [b"\x00"], "ac": [b"\x00"]})
    assert complete.complete and complete.chunk_span(1) == range(4, 5)
    with pytest.raises(CatalogError):
        complete.with_chunk({"int8": [b"\x00"], "ac": [b"\x00"]})


def test_construction_checks_every_bound() -> None:
    catalog = vector_catalog()
    with pytest.raises(CatalogError):
        TrackEntry("catalog", None)
    with pytest.raises(CatalogError):
        TrackEntry("ac", b"\x00" * (MAX_TABLES_BYTES + 1))
    with pytest.raises(CatalogError):
        TrackEntry("ac", None, (1,), ())
    with pytest.raises(CatalogError):
        TrackEntry("ac", None, (-1,), (bytes(32),))
    with pytest.raises(CatalogError):
        TrackEntry("ac", None, (1,), (bytes(31),))
    unsorted = (catalog.tracks[1], catalog.tracks[0])
    uneven = (catalog.tracks[0], TrackEntry("int8", None))
    for tracks in [(), unsorted, uneven]:
        with pytest.raises(CatalogError):
            Catalog(catalog.model, LAYOUT, 5, 4, catalog.chunk_hashes, tracks)
    with pytest.raises(CatalogError):
        Catalog(catalog.model, LAYOUT, 5, 4, catalog.chunk_hashes[:1], catalog.tracks)


def mutate(field_path: tuple[str, ...], value: object) -> bytes:
    """The vector with one field replaced, re-serialised canonically."""
    root = json.loads(VECTOR_BYTES)
    node = root
    for key in field_path[:-1]:
        node = node[key]
    node[field_path[-1]] = value
    return json.dumps(root, sort_keys=True, separators=(",", ":")).encode()


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("version",), 2),
        (("version",), True),
        (("token_count",), 9),
        (("token_count",), 5.0),
        (("token_count",), "5"),
        (("chunk_size",), 0),
        (("chunk_size",), 8),
        (("model",), ""),
        (("model",), 7),
        (("layout", "num_layers"), 0),
        (("layout",), {"num_layers": 2}),
        (("chunk_hashes",), "AAAA"),
        (("chunk_hashes",), "not base64!"),
        (("tracks",), {}),
        (("tracks",), []),
        (("tracks", "catalog"), {"digests": "", "sizes": [], "tables": None}),
        (("tracks", "int8", "sizes"), []),
        (("tracks", "int8", "sizes"), [True]),
        (("tracks", "int8", "sizes"), [-1]),
        (("tracks", "int8", "sizes"), "8"),
        (("tracks", "int8", "digests"), "AAAA"),
        (("tracks", "int8", "tables"), 1),
        (("tracks", "int8", "extra"), 1),
        (("extra",), 1),
    ],
)
def test_malformed_fields_are_rejected(path: tuple[str, ...], value: object) -> None:
    with pytest.raises(CatalogError):
        Catalog.decode(mutate(path, value))


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"[]",
        b"null",
        b"\xff\xfe",
        VECTOR_BYTES[:-1],
        VECTOR_BYTES + b" ",
        b" " + VECTOR_BYTES,
        VECTOR_BYTES.replace(b'"version":1', b'"version":1.0'),
        VECTOR_BYTES.replace(b'"version":1', b'"version":NaN'),
        VECTOR_BYTES.replace(b'"version":1', b'"version":01'),
        VECTOR_BYTES.replace(b'"version":1', b'"version":1,"version":1'),
        VECTOR_BYTES.replace(b'"chunk_size":4', b'"chunk_size":' + b"9" * 5000),
        VECTOR_BYTES.replace(b'"tables":"AQID"', b'"tables":"AQJ="'),
        VECTOR_BYTES.replace(b"demo/model", b"demo\\/model"),
        VECTOR_BYTES.replace(b"demo/model", b"d\\u0065mo/model"),
        json.dumps(
            dict(reversed(json.loads(VECTOR_BYTES).items())), separators=(",", ":")
        ).encode(),
        b"[" * 100_000 + b"]" * 100_000,
        b"[" + b"0," * 200_000 + b"0]",
        b" " * (MAX_CATALOG_BYTES + 1),
    ],
)
def test_non_canonical_or_hostile_bytes_are_rejected(data: bytes) -> None:
    with pytest.raises(CatalogError):
        Catalog.decode(data)


@settings(max_examples=300)
@given(st.data())
def test_mutated_catalogs_decode_or_raise_catalog_error(data: st.DataObject) -> None:
    raw = bytearray(VECTOR_BYTES)
    for _ in range(data.draw(st.integers(1, 4))):
        position = data.draw(st.integers(0, len(raw) - 1))
        raw[position] = data.draw(st.integers(0, 255))
    try:
        catalog = Catalog.decode(bytes(raw))
    except CatalogError:
        return
    assert catalog.encode() == raw
