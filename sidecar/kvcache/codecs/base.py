"""The interface every compression implements, and the checks they all share.

A codec turns the KV of one chunk (`[L, 2, T, H, D]`, any float dtype, on any device) into one
payload per token (the MoQT object of that token), and any subset of those payloads back into
KV. A token's payload decodes on its own given the layout and the prompt's shared tables
(relays serve arbitrary ranges), so nothing in a payload refers to its neighbours.

Shared tables are opaque bytes that travel once per prompt in its catalog; only codecs with a
learned model (`ac`) have them. Codecs parse them lazily and cache the parsed form, so callers
can pass the same bytes with every chunk.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import numpy as np
import torch

from ..errors import PayloadError, TablesError, TensorError
from ..layout import KVLayout

PAYLOAD_VERSION = 3
"""First byte of every token payload; bumped with any change to a payload format."""

MAX_TOKENS_PER_CALL = 1 << 16
"""Bound on payloads per decode call, so a caller cannot be made to allocate without limit."""

ENCODE_BATCH_ELEMENTS = 1 << 19
"""KV values a codec encodes in one pass: `encode` takes a chunk in batches of whole tokens
about this large (22 of SmolLM2-135M's), because a codec's float32 temporaries run to several
times its input. A whole 128-token chunk at once left 24 MB of them with the allocator in a
publishing sidecar, and was slower: the batches' temporaries stay in the CPU's caches (one
thread, MB/s of fp16 in, 128-token chunk -> batches: int8 416 -> 698, int4 272 -> 594, fp8
257 -> 634, fp4 150 -> 338, fp16 362 -> 2085, ac 141 -> 145; 1 << 18 and 1 << 20 measured
slower). Payloads are per token, so the batches change no byte."""


class Codec(ABC):
    """One compression of a token's KV; stateless apart from caches of parsed tables."""

    name: str

    def fit_tables(self, layout: KVLayout, sample: torch.Tensor) -> bytes | None:
        """Tables shared by every chunk of a prompt, built from any sample of its KV.

        The sample may be just the first chunk: chunks are published while prefill still
        runs, so the tables cannot wait for the whole prompt. Codecs without tables return None.
        """
        layout.check(sample)
        return None

    def encode(
        self, kv: torch.Tensor, layout: KVLayout, tables: bytes | None = None
    ) -> list[bytes]:
        """One payload per token of `kv` (`[L, 2, T, H, D]`), in token order.

        Raises `TensorError` for a tensor that does not match `layout` or holds NaN/Inf, and
        `TablesError` for tables that are missing, corrupt or fitted to another layout.
        """
        num_tokens = layout.check(kv)
        step = max(1, ENCODE_BATCH_ELEMENTS // layout.elements_per_token)
        payloads: list[bytes] = []
        # An empty `kv` still makes one call: bad tables are refused whatever the size.
        for start in range(0, max(num_tokens, 1), step):
            payloads += self._encode_batch(kv[:, :, start : start + step], layout, tables)
        return payloads

    @abstractmethod
    def _encode_batch(
        self, kv: torch.Tensor, layout: KVLayout, tables: bytes | None
    ) -> list[bytes]:
        """`encode` for a batch of at most `ENCODE_BATCH_ELEMENTS` values (whole tokens)."""

    @abstractmethod
    def decode(
        self,
        payloads: Sequence[bytes],
        layout: KVLayout,
        tables: bytes | None = None,
        *,
        device: torch.device | str | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """KV `[L, 2, T, H, D]` in `layout.dtype` for T payloads, given in token order.

        With `out` (a possibly strided view, e.g. into a paged cache) the result is written
        there and `out` is returned; `device` defaults to `out`'s device, else the CPU.
        Raises `PayloadError` for truncated, overlong or corrupt payloads.
        """


def all_finite(values: torch.Tensor, dtype: torch.dtype | None = None) -> bool:
    """No NaN/Inf, and every value representable in `dtype` (default: its own) without overflow.

    One reduction instead of `isfinite(...).all()`, which is 10x slower on CPU.
    """
    low, high = torch.aminmax(values)
    limit = torch.finfo(dtype or values.dtype).max
    return bool((low >= -limit) & (high <= limit))


def check_tables_absent(name: str, tables: bytes | None) -> None:
    """Codecs without tables refuse them, so a catalog mix-up is not silently ignored."""
    if tables is not None:
        raise TablesError(f"codec {name!r} takes no tables, got {len(tables)} bytes")


def check_payloads(payloads: Sequence[bytes]) -> int:
    """Validate the container of a decode call and return the token count."""
    if isinstance(payloads, (bytes, bytearray, memoryview)) or not isinstance(payloads, Sequence):
        raise PayloadError("payloads must be a sequence of bytes objects, one per token")
    count = len(payloads)
    if not 1 <= count <= MAX_TOKENS_PER_CALL:
        raise PayloadError(f"need 1..{MAX_TOKENS_PER_CALL} payloads, got {count}")
    for index, payload in enumerate(payloads):
        if not isinstance(payload, (bytes, bytearray, memoryview)):
            raise PayloadError(f"payload {index} is {type(payload).__name__}, not bytes")
        if len(payload) < 1 or payload[0] != PAYLOAD_VERSION:
            version = payload[0] if len(payload) else None
            raise PayloadError(f"payload {index}: unsupported payload version {version!r}")
    return count


def split_fixed(
    payloads: Sequence[bytes], size: int, body: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Payloads of one fixed `size` as two uint8 CPU tensors: `[T, body - 1]`, the bytes
    after the version byte and before offset `body` (a codec's scales), and `[T, size -
    body]`, the rest. Each byte is copied once, straight into its row (a decode's one pass
    over the payloads), and each tensor starts aligned for the element views the codecs take
    of it."""
    count = check_payloads(payloads)
    # torch's allocations: its integer products want their alignment, which numpy's lack.
    heads = torch.empty((count, body - 1), dtype=torch.uint8)
    bodies = torch.empty((count, size - body), dtype=torch.uint8)
    head_rows, body_rows = heads.numpy(), bodies.numpy()
    for index, payload in enumerate(payloads):
        if len(payload) != size:
            raise PayloadError(f"payload {index} has {len(payload)} bytes, expected {size}")
        row = np.frombuffer(payload, dtype=np.uint8)
        head_rows[index] = row[1:body]
        body_rows[index] = row[body:]
    return heads, bodies


def split_rows(rows: torch.Tensor) -> list[bytes]:
    """`[T, n]` uint8 rows (any device) as T bytes objects."""
    data = rows.contiguous().cpu().numpy().tobytes()
    size = rows.shape[1]
    return [data[i * size : (i + 1) * size] for i in range(rows.shape[0])]


def destination(
    layout: KVLayout,
    num_tokens: int,
    device: torch.device | str | None,
    out: torch.Tensor | None,
) -> torch.Tensor:
    """The tensor a decode writes into: `out` after checking it, or a fresh one."""
    shape = layout.shape(num_tokens)
    if out is None:
        return torch.empty(shape, dtype=layout.torch_dtype, device=device or "cpu")
    if tuple(out.shape) != shape or out.dtype != layout.torch_dtype:
        raise TensorError(
            f"out is {tuple(out.shape)} {out.dtype}, expected {shape} {layout.torch_dtype}"
        )
    if device is not None and torch.device(device) != out.device:
        raise TensorError(f"out is on {out.device}, but device {device} was requested")
    return out


def token_major(kv: torch.Tensor, layout: KVLayout) -> torch.Tensor:
    """`[L, 2, T, H, D]` -> `[T, L, 2, H*D]`: the byte order of every payload (one copy)."""
    num_tokens = kv.shape[2]
    shaped = kv.permute(2, 0, 1, 3, 4).reshape(num_tokens, layout.num_layers, 2, layout.channels)
    return shaped.contiguous()


def write_layer_major(values: torch.Tensor, layout: KVLayout, dst: torch.Tensor) -> torch.Tensor:
    """Inverse of `token_major`, casting into the destination."""
    num_tokens = values.shape[0]
    shaped = values.view(num_tokens, layout.num_layers, 2, layout.num_kv_heads, layout.head_dim)
    dst.copy_(shaped.permute(1, 2, 0, 3, 4))
    return dst
