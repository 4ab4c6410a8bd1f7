"""The codecs run on the tensor's device: CUDA tensors code to the same bytes as CPU ones.

The scaled fixed-width codecs rotate in float32 (codecs/rotation.py), whose sums the GPU
orders differently: decoded values may then differ from the CPU's by one fp16 ulp, and a
value that lands exactly on a rounding tie could in principle code differently (none does in
this test's data).
"""

from __future__ import annotations

import pytest
import torch

from sidecar.kvcache.codecs import CODEC_NAMES, get_codec
from sidecar.kvcache.layout import KVLayout

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("name", CODEC_NAMES)
def test_cuda_tensors_code_like_cpu_tensors(name: str) -> None:
    layout = KVLayout(4, 2, 8, dtype="float16")
    generator = torch.Generator().manual_seed(0)
    kv = (torch.randn(layout.shape(9), generator=generator) * 3).to(torch.float16)
    codec = get_codec(name)
    tables = codec.fit_tables(layout, kv)
    payloads = codec.encode(kv, layout, tables)
    assert codec.fit_tables(layout, kv.cuda()) == tables
    assert codec.encode(kv.cuda(), layout, tables) == payloads
    on_gpu = codec.decode(payloads, layout, tables, device="cuda")
    assert on_gpu.is_cuda
    torch.testing.assert_close(
        on_gpu.cpu(), codec.decode(payloads, layout, tables), rtol=2.0**-10, atol=2.0**-14
    )
    cache = torch.zeros(layout.shape(12), dtype=torch.float16, device="cuda")
    codec.decode(payloads, layout, tables, out=cache[:, :, 2:11])
    assert torch.equal(cache[:, :, 2:11], on_gpu)
