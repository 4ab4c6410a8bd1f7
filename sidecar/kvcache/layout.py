"""The shape of a model's KV cache, how a prompt's KV is cut into chunks, and paged blocks.

Every codec, the catalog and the transfer layer agree on one tensor convention: the KV of a
span of tokens is `[num_layers, 2, num_tokens, num_kv_heads, head_dim]` (index 0 = K, 1 = V).
A layout arrives from the network inside a catalog, so its bounds are checked before any
buffer is sized from it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from .errors import LayoutError, TensorError

MAX_LAYERS = 1024
MAX_KV_HEADS = 1024
MAX_HEAD_DIM = 1024
MAX_CHUNK_SIZE = 4096
DEFAULT_CHUNK_SIZE = 128

DTYPES: dict[str, torch.dtype] = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
}


def _bounded_int(value: Any, name: str, upper: int) -> int:
    # bool is an int subclass; a JSON `true` must not pass as 1.
    if type(value) is not int or not 1 <= value <= upper:
        raise LayoutError(f"{name} must be an integer in [1, {upper}], got {value!r}")
    return value


@dataclass(frozen=True)
class KVLayout:
    """Dimensions and cache dtype of one model's KV; the codecs' contract with the catalog."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str = "float16"

    def __post_init__(self) -> None:
        _bounded_int(self.num_layers, "num_layers", MAX_LAYERS)
        _bounded_int(self.num_kv_heads, "num_kv_heads", MAX_KV_HEADS)
        _bounded_int(self.head_dim, "head_dim", MAX_HEAD_DIM)
        if self.dtype not in DTYPES:
            raise LayoutError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def channels(self) -> int:
        """Values per (layer, K|V, token): heads and head dims flattened, as the codecs see them."""
        return self.num_kv_heads * self.head_dim

    @property
    def elements_per_token(self) -> int:
        return self.num_layers * 2 * self.channels

    @property
    def fp16_bytes_per_token(self) -> int:
        """The yardstick of every compression ratio: the token's KV in fp16."""
        return 2 * self.elements_per_token

    def shape(self, num_tokens: int) -> tuple[int, int, int, int, int]:
        return (self.num_layers, 2, num_tokens, self.num_kv_heads, self.head_dim)

    def check(self, kv: torch.Tensor, *, finite: bool = False) -> int:
        """Validate a KV tensor against this layout and return its token count.

        `finite` costs a pass over the data; codecs whose own arithmetic already exposes
        NaN/Inf (through the per-token scales) leave it off. It goes layer by layer: on the
        whole tensor at once, torch's temporaries came to 2.5x the KV (a publishing sidecar's
        peak memory).
        """
        if not isinstance(kv, torch.Tensor):
            raise TensorError(f"expected a torch.Tensor, got {type(kv).__name__}")
        if not kv.is_floating_point():
            raise TensorError(f"KV must be a floating-point tensor, got {kv.dtype}")
        if kv.dim() != 5:
            raise TensorError(f"KV must have 5 dims [L, 2, T, H, D], got shape {tuple(kv.shape)}")
        expected = self.shape(kv.shape[2])
        if tuple(kv.shape) != expected:
            raise TensorError(f"KV shape {tuple(kv.shape)} does not match layout {expected}")
        if finite and not all(bool(torch.isfinite(layer).all()) for layer in kv):
            raise TensorError("KV contains NaN or Inf")
        return kv.shape[2]

    def to_dict(self) -> dict[str, Any]:
        return {
            "num_layers": self.num_layers,
            "num_kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "dtype": self.dtype,
        }

    @classmethod
    def from_dict(cls, data: Any) -> KVLayout:
        """Inverse of `to_dict`; rejects missing, extra and out-of-bounds fields."""
        fields = {"num_layers", "num_kv_heads", "head_dim", "dtype"}
        if not isinstance(data, dict) or set(data) != fields:
            raise LayoutError(f"layout must be a dict with exactly the keys {sorted(fields)}")
        return cls(**data)


def chunk_ranges(num_tokens: int, chunk_size: int = DEFAULT_CHUNK_SIZE) -> list[range]:
    """Token ranges of the chunks (MoQT groups) of a prompt; only the last may be partial."""
    if type(num_tokens) is not int or num_tokens < 0:
        raise LayoutError(f"num_tokens must be a non-negative integer, got {num_tokens!r}")
    _bounded_int(chunk_size, "chunk_size", MAX_CHUNK_SIZE)
    return [
        range(start, min(start + chunk_size, num_tokens))
        for start in range(0, num_tokens, chunk_size)
    ]


def iter_chunks(
    kv: torch.Tensor, layout: KVLayout, chunk_size: int = DEFAULT_CHUNK_SIZE
) -> Iterator[torch.Tensor]:
    """Views of `kv` chunk by chunk (no copies), in the `[L, 2, T, H, D]` convention."""
    for span in chunk_ranges(layout.check(kv), chunk_size):
        yield kv[:, :, span.start : span.stop]


MAX_BLOCK_SIZE = 4096
MAX_BLOCKS = 1 << 20


@dataclass(frozen=True)
class BlockRun:
    """Tokens `[start, stop)` of a span live in `block_id` from slot `offset` on."""

    block_id: int
    offset: int
    start: int
    stop: int


@dataclass(frozen=True)
class PagedBlocks:
    """Where a span's tokens live in a vLLM-style paged cache: fixed-size blocks, in order.

    Token `i` of the span sits in block `block_ids[i // block_size]`, slot `i % block_size`;
    a decoder writes each run of tokens into its block's view instead of one flat tensor.
    """

    block_size: int
    block_ids: tuple[int, ...]

    def __post_init__(self) -> None:
        _bounded_int(self.block_size, "block_size", MAX_BLOCK_SIZE)
        if not isinstance(self.block_ids, tuple) or len(self.block_ids) > MAX_BLOCKS:
            raise LayoutError(f"block_ids must be a tuple of at most {MAX_BLOCKS} ids")
        for block_id in self.block_ids:
            if type(block_id) is not int or not 0 <= block_id < 2**31:
                raise LayoutError(f"block ids must be integers in [0, 2^31), got {block_id!r}")

    @property
    def capacity(self) -> int:
        return self.block_size * len(self.block_ids)

    def runs(self, start: int, stop: int) -> list[BlockRun]:
        """The block runs covering tokens `[start, stop)` of the span, in order."""
        self._check_span(start, stop)
        runs = []
        position = start
        while position < stop:
            block, offset = divmod(position, self.block_size)
            end = min(stop, (block + 1) * self.block_size)
            runs.append(BlockRun(self.block_ids[block], offset, position, end))
            position = end
        return runs

    def slots(self, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The block id and the slot of each token `[start, stop)`, as index tensors: one
        indexed copy instead of one per run (on a GPU, where every copy is a kernel launch)."""
        self._check_span(start, stop)
        tokens = torch.arange(start, stop)
        return torch.tensor(self.block_ids)[tokens // self.block_size], tokens % self.block_size

    def _check_span(self, start: int, stop: int) -> None:
        if not 0 <= start <= stop <= self.capacity:
            raise LayoutError(f"tokens [{start}, {stop}) exceed {self.capacity} paged slots")
