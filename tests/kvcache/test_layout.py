"""KVLayout: bounds, serialisation and chunk slicing."""

from __future__ import annotations

import json

import pytest
import torch

from sidecar.kvcache.errors import KVCodecError, LayoutError, TensorError
from sidecar.kvcache.layout import (
    DEFAULT_CHUNK_SIZE,
    BlockRun,
    KVLayout,
    PagedBlocks,
    chunk_ranges,
    iter_chunks,
)

SMOLLM2 = KVLayout(num_layers=30, num_kv_heads=3, head_dim=64, dtype="float16")


def test_sizes_of_smollm2() -> None:
    assert SMOLLM2.channels == 192
    assert SMOLLM2.elements_per_token == 30 * 2 * 3 * 64
    assert SMOLLM2.fp16_bytes_per_token == 23040
    assert SMOLLM2.shape(5) == (30, 2, 5, 3, 64)
    assert SMOLLM2.torch_dtype is torch.float16


@pytest.mark.parametrize(
    "fields",
    [
        {"num_layers": 0},
        {"num_layers": 1025},
        {"num_kv_heads": 2000},
        {"head_dim": -1},
        {"head_dim": 1.5},
        {"num_layers": True},
        {"dtype": "int8"},
        {"dtype": "float64"},
    ],
)
def test_out_of_bounds_layouts_are_rejected(fields: dict) -> None:
    with pytest.raises(LayoutError):
        KVLayout(**{**SMOLLM2.to_dict(), **fields})


def test_dict_round_trip_through_json() -> None:
    data = json.loads(json.dumps(SMOLLM2.to_dict()))
    assert KVLayout.from_dict(data) == SMOLLM2


@pytest.mark.parametrize(
    "data",
    [
        None,
        [30, 3, 64],
        {"num_layers": 30, "num_kv_heads": 3, "head_dim": 64},
        {**SMOLLM2.to_dict(), "extra": 1},
        {**SMOLLM2.to_dict(), "num_layers": "30"},
        {**SMOLLM2.to_dict(), "head_dim": 10**9},
    ],
)
def test_from_dict_rejects_malformed(data: object) -> None:
    with pytest.raises(LayoutError):
        KVLayout.from_dict(data)


def test_check_returns_token_count() -> None:
    assert SMOLLM2.check(torch.zeros(SMOLLM2.shape(7))) == 7
    assert SMOLLM2.check(torch.zeros(SMOLLM2.shape(0), dtype=torch.bfloat16)) == 0


@pytest.mark.parametrize(
    "tensor",
    [
        torch.zeros(30, 2, 4, 3, 63),
        torch.zeros(30, 1, 4, 3, 64),
        torch.zeros(2, 4, 3, 64),
        torch.zeros(30, 2, 4, 3, 64, dtype=torch.int32),
    ],
)
def test_check_rejects_wrong_shapes_and_dtypes(tensor: torch.Tensor) -> None:
    with pytest.raises(TensorError):
        SMOLLM2.check(tensor)


def test_check_finite_on_request() -> None:
    kv = torch.zeros(SMOLLM2.shape(2))
    kv[3, 1, 1, 2, 5] = float("nan")
    SMOLLM2.check(kv)
    with pytest.raises(TensorError, match="NaN"):
        SMOLLM2.check(kv, finite=True)


def test_check_rejects_non_tensors() -> None:
    with pytest.raises(KVCodecError):
        SMOLLM2.check([[1.0]])  # type: ignore[arg-type]


def test_chunk_ranges_cover_the_prompt_with_a_partial_tail() -> None:
    ranges = chunk_ranges(300)
    assert [(r.start, r.stop) for r in ranges] == [(0, 128), (128, 256), (256, 300)]
    assert chunk_ranges(256, 128)[-1] == range(128, 256)
    assert chunk_ranges(0) == []
    assert DEFAULT_CHUNK_SIZE == 128


@pytest.mark.parametrize("bad", [(-1, 128), (10, 0), (10, 1 << 20), (10, 2.0)])
def test_chunk_ranges_reject_bad_arguments(bad: tuple) -> None:
    with pytest.raises(LayoutError):
        chunk_ranges(*bad)


def test_iter_chunks_yields_views() -> None:
    layout = KVLayout(2, 1, 4)
    kv = torch.arange(2 * 2 * 5 * 4, dtype=torch.float32).view(layout.shape(5))
    chunks = list(iter_chunks(kv, layout, chunk_size=2))
    assert [c.shape[2] for c in chunks] == [2, 2, 1]
    assert torch.equal(torch.cat(chunks, dim=2), kv)
    assert chunks[1].data_ptr() == kv[:, :, 2:].data_ptr()


def test_paged_blocks_split_a_span_into_block_runs() -> None:
    blocks = PagedBlocks(block_size=16, block_ids=(7, 3, 9))
    assert blocks.capacity == 48
    assert blocks.runs(10, 40) == [
        BlockRun(block_id=7, offset=10, start=10, stop=16),
        BlockRun(block_id=3, offset=0, start=16, stop=32),
        BlockRun(block_id=9, offset=0, start=32, stop=40),
    ]
    assert blocks.runs(5, 5) == []
    with pytest.raises(LayoutError):
        blocks.runs(0, 49)


def test_paged_blocks_name_each_tokens_block_and_slot_as_the_runs_do() -> None:
    blocks = PagedBlocks(block_size=16, block_ids=(7, 3, 9))
    ids, slots = blocks.slots(10, 40)
    expected = [
        (r.block_id, r.offset + i) for r in blocks.runs(10, 40) for i in range(r.stop - r.start)
    ]
    assert list(zip(ids.tolist(), slots.tolist(), strict=True)) == expected
    with pytest.raises(LayoutError):
        blocks.slots(0, 49)


@pytest.mark.parametrize(
    ("block_size", "block_ids"),
    [(0, (1,)), (16, [1, 2]), (16, (-1,)), (16, (2**31,)), (16, (True,)), (10**6, (1,))],
)
def test_paged_blocks_reject_bad_descriptions(block_size: int, block_ids: object) -> None:
    with pytest.raises(LayoutError):
        PagedBlocks(block_size, block_ids)  # type: ignore[arg-type]
