"""The codecs run on the tensor's device: CUDA tensors code to the same bytes as CPU ones.

Payloads are the wire format, so they must be the same bytes: the encoder's rotation sums
exactly (codecs/rotation.py). The decoder's rotation sums in float32, in the order the GPU's
kernel picks, so decoded values may differ from the CPU's by one ulp of the cache's dtype.
"""

from __future__ import annotations

import pytest
import torch

from sidecar.kvcache.codecs import CODEC_NAMES, get_codec
from sidecar.kvcache.layout import KVLayout

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", CODEC_NAMES)
def test_cuda_tensors_code_like_cpu_tensors(name: str, dtype: str) -> None:
    layout = KVLayout(8, 8, 128, dtype=dtype)  # 16k scales a chunk: rare roundings happen
    generator = torch.Generator().manual_seed(0)
    kv = torch.randn(layout.shape(128), generator=generator) * 3
    kv[..., 5] *= 40  # an outlier channel, as real K has
    kv = kv.to(layout.torch_dtype)
    codec = get_codec(name)
    tables = codec.fit_tables(layout, kv)
    payloads = codec.encode(kv, layout, tables)
    assert codec.fit_tables(layout, kv.cuda()) == tables
    assert codec.encode(kv.cuda(), layout, tables) == payloads
    on_gpu = codec.decode(payloads, layout, tables, device="cuda")
    assert on_gpu.is_cuda
    ulp = 2.0**-7 if dtype == "bfloat16" else 2.0**-10
    torch.testing.assert_close(
        on_gpu.cpu(), codec.decode(payloads, layout, tables), rtol=ulp, atol=2.0**-14
    )
    cache = torch.zeros(layout.shape(131), dtype=layout.torch_dtype, device="cuda")
    codec.decode(payloads, layout, tables, out=cache[:, :, 2:130])
    assert torch.equal(cache[:, :, 2:130], on_gpu)
