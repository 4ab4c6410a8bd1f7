"""BufferSet in process: a prompt's KV read out of paged buffers and a chunk written back,
on the CPU and (where there is one) on a GPU, whose copies run on its codec streams."""

from __future__ import annotations

import pytest
import torch

from sidecar.kvcache.layout import KVLayout
from sidecar.service.buffers import BlockIds, BufferSet, KVBuffer, KVPart, Paged
from sidecar.service.errors import InvalidArgument
from tests.support.sidecar import synthetic_kv

LAYOUT = KVLayout(num_layers=2, num_kv_heads=2, head_dim=8, dtype="float16")
BLOCK, BLOCKS = 4, 8
DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=pytest.mark.cuda,
    ),
]


def paged_buffers(device: str) -> tuple[BufferSet, list[torch.Tensor]]:
    """Keys and values stacked per layer, `[2, blocks, block size, heads, dim]`."""
    shape = (2, BLOCKS, BLOCK, LAYOUT.num_kv_heads, LAYOUT.head_dim)
    tensors = [torch.zeros(shape, dtype=torch.float16, device=device) for _ in range(2)]
    buffers = [KVBuffer(layer, KVPart.KEY_VALUE, t) for layer, t in enumerate(tensors)]
    return BufferSet("m", LAYOUT, Paged(BLOCK, BLOCKS), buffers), tensors


@pytest.mark.parametrize("device", DEVICES)
def test_a_chunk_written_reads_back_from_its_blocks(device: str) -> None:
    buffers, tensors = paged_buffers(device)
    kv = synthetic_kv(LAYOUT, 10)
    placement = BlockIds((5, 0, 3))  # 10 tokens: 4 + 4 + 2
    buffers.write(placement, range(0, 6), kv[:, :, :6])
    buffers.write(placement, range(6, 10), kv[:, :, 6:])
    # On a GPU, `write` returned after its stream finished: the default stream sees it all.
    assert torch.equal(tensors[1][0, 3, :2].cpu(), kv[1, 0, 8:10])
    assert torch.equal(tensors[0][1, 0].cpu(), kv[0, 1, 4:8])
    assert not tensors[0][:, 1].any()  # a block not in the list is untouched
    read = buffers.read(placement, 10)  # where the codecs then encode it
    assert read.device.type == device and torch.equal(read.cpu(), kv)


def test_the_buffers_of_one_set_are_on_one_device() -> None:
    shape = (2, BLOCKS, BLOCK, LAYOUT.num_kv_heads, LAYOUT.head_dim)
    tensors = [torch.zeros(shape, dtype=torch.float16, device=d) for d in ("cpu", "meta")]
    buffers = [KVBuffer(layer, KVPart.KEY_VALUE, t) for layer, t in enumerate(tensors)]
    with pytest.raises(InvalidArgument, match="on one device, not cpu, meta"):
        BufferSet("m", LAYOUT, Paged(BLOCK, BLOCKS), buffers)
