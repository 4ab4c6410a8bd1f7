"""How a prompt's KV cache is named in MoQT: namespace, track names, prompt ids.

The prompt id is a hash chain over the token ids, one link per chunk, so the relays and every
other node see only digests, never the prompt, and two prompts that share their first k
chunks share their first k links: a subscriber finds a reusable prefix by comparing links
(`prefix_index`) without any KV changing hands.

    link[-1] = 32 zero bytes
    link[i]  = SHA-256(link[i-1] || CHAIN_TAG || u32le(chunk_size) || u32le(token) for each
                                                                      token of chunk i)
    prompt id = lower-case hex of the last link (64 characters, never truncated)

The chunk size is hashed into every link so that two chunkings of the same tokens never
produce equal links (their chunks hold different KV objects). The tokens are the only
variable-length input and come last, so the encoding is unambiguous without a count. The tag
is the same for every model: the model is a namespace field of its own.

Keyed chains: unkeyed, anyone who can guess a prompt (a short one, a known system prompt)
can compute its id and confirm the guess against what a relay carries. A deployment with a
prompt key (`--prompt-key`) computes every link as HMAC-SHA256(key, same input) instead, so
ids reveal nothing without the key, and sidecars that share the key still share prefixes.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from .codecs import CODEC_NAMES
from .errors import KVCodecError
from .layout import DEFAULT_CHUNK_SIZE, MAX_CHUNK_SIZE, chunk_ranges

NAMESPACE_ROOT = "kvcache.moq.arpa/v1"
CATALOG_TRACK = "catalog"
PAYLOAD_TRACKS: tuple[str, ...] = CODEC_NAMES
TRACK_NAMES: tuple[str, ...] = (*PAYLOAD_TRACKS, CATALOG_TRACK)

CHAIN_TAG = b"kvcache.moq.arpa/v1 chunk"
LINK_BYTES = 32
PROMPT_ID_CHARS = 2 * LINK_BYTES
_HEX_DIGITS = frozenset("0123456789abcdef")

MAX_TOKENS = 1 << 20
MAX_TOKEN_ID = (1 << 32) - 1
MAX_CHUNKS = 1 << 14
"""Bounds the catalog (one link and one digest per track per chunk) to a few MiB."""

MAX_FULL_TRACK_NAME = 4096
"""draft-14: the namespace fields plus the track name total at most 4096 bytes."""

MAX_MODEL_NAME_BYTES = (
    MAX_FULL_TRACK_NAME
    - len(NAMESPACE_ROOT)
    - PROMPT_ID_CHARS
    - max(len(name) for name in TRACK_NAMES)
)
"""What is left of the draft-14 budget once the other fields take their (fixed) lengths."""


class NamingError(KVCodecError):
    """A model name, prompt id, token list, chunk size or namespace is out of bounds."""


@dataclass(frozen=True, slots=True)
class PromptName:
    """The two variable fields of a KV namespace: which model, which prompt."""

    model: str
    prompt_id: str

    def __post_init__(self) -> None:
        check_model_name(self.model)
        check_prompt_id(self.prompt_id)

    def namespace(self) -> tuple[bytes, bytes, bytes]:
        """The MoQT namespace tuple of this prompt's tracks."""
        return (*namespace_prefix(self.model), self.prompt_id.encode())

    @classmethod
    def from_namespace(cls, fields: Sequence[bytes]) -> PromptName:
        """Parse an announced namespace; `NamingError` for any namespace that is not ours."""
        if len(fields) != 3 or fields[0] != NAMESPACE_ROOT.encode():
            raise NamingError(f"not a {NAMESPACE_ROOT} namespace: {len(fields)} fields")
        model, prompt = fields[1], fields[2]
        if len(model) > MAX_MODEL_NAME_BYTES or len(prompt) != PROMPT_ID_CHARS:
            raise NamingError("namespace field lengths out of bounds")
        try:
            return cls(model.decode(), prompt.decode("ascii"))
        except UnicodeDecodeError as exc:
            raise NamingError(f"namespace field is not valid text: {exc.reason}") from None


def namespace_prefix(model: str) -> tuple[bytes, bytes]:
    """What a subscriber passes to SUBSCRIBE_NAMESPACE to hear of every prompt of a model."""
    check_model_name(model)
    return (NAMESPACE_ROOT.encode(), model.encode())


def check_model_name(model: str) -> None:
    """A model name fits the draft-14 budget and is printable (it ends up in logs)."""
    if not isinstance(model, str) or not model or not model.isprintable():
        raise NamingError(f"model name must be a non-empty printable string, got {model!r}")
    try:
        size = len(model.encode())
    except UnicodeEncodeError:
        raise NamingError("model name is not encodable as UTF-8") from None
    if size > MAX_MODEL_NAME_BYTES:
        raise NamingError(f"model name is {size} bytes, at most {MAX_MODEL_NAME_BYTES}")


def check_prompt_id(prompt_id: str) -> None:
    if (
        not isinstance(prompt_id, str)
        or len(prompt_id) != PROMPT_ID_CHARS
        or not set(prompt_id) <= _HEX_DIGITS
    ):
        raise NamingError(f"prompt id must be {PROMPT_ID_CHARS} lower-case hex digits")


def check_chunk_size(chunk_size: int) -> None:
    if type(chunk_size) is not int or not 1 <= chunk_size <= MAX_CHUNK_SIZE:
        raise NamingError(f"chunk size must be an integer in [1, {MAX_CHUNK_SIZE}]")


def chunk_count(token_count: int, chunk_size: int) -> int:
    """Chunks (MoQT groups) of a prompt; `NamingError` past MAX_TOKENS or MAX_CHUNKS."""
    check_chunk_size(chunk_size)
    if type(token_count) is not int or not 1 <= token_count <= MAX_TOKENS:
        raise NamingError(f"token count must be an integer in [1, {MAX_TOKENS}]")
    count = -(-token_count // chunk_size)
    if count > MAX_CHUNKS:
        raise NamingError(f"{count} chunks of {chunk_size} tokens, at most {MAX_CHUNKS}")
    return count


def chunk_links(
    token_ids: Sequence[int], chunk_size: int = DEFAULT_CHUNK_SIZE, key: bytes | None = None
) -> list[bytes]:
    """Every link of the prompt's hash chain, one per chunk (the last one may be partial);
    keyed with `key` (HMAC-SHA256) when the deployment has one."""
    chunk_count(len(token_ids), chunk_size)
    prefix = CHAIN_TAG + struct.pack("<I", chunk_size)
    link = bytes(LINK_BYTES)
    links = []
    for span in chunk_ranges(len(token_ids), chunk_size):
        chunk = token_ids[span.start : span.stop]
        try:
            packed = struct.pack(f"<{len(chunk)}I", *chunk)
        except struct.error:
            raise NamingError(f"token ids must be integers in [0, {MAX_TOKEN_ID}]") from None
        data = link + prefix + packed
        if key is None:
            link = hashlib.sha256(data).digest()
        else:
            link = hmac.new(key, data, hashlib.sha256).digest()
        links.append(link)
    return links


def prompt_id(
    token_ids: Sequence[int], chunk_size: int = DEFAULT_CHUNK_SIZE, key: bytes | None = None
) -> str:
    """The namespace field that names a prompt: the hex of the last link of its chain."""
    return chunk_links(token_ids, chunk_size, key)[-1].hex()
