"""One module per compression of a token's KV; `get_codec(name)` maps a track name to it."""

from __future__ import annotations

from ..errors import UnknownCodecError
from ..tracks import CODEC_NAMES
from .ac import AC
from .base import Codec
from .bf16 import BF16
from .fp4 import FP4
from .fp8 import FP8
from .fp16 import FP16
from .int4 import INT4
from .int8 import INT8

_CODECS: dict[str, Codec] = {codec.name: codec for codec in (FP16, BF16, FP8, INT8, FP4, INT4, AC)}
assert tuple(_CODECS) == CODEC_NAMES


def get_codec(name: str) -> Codec:
    """The codec for a track name; `UnknownCodecError` for anything not in CODEC_NAMES."""
    try:
        return _CODECS[name]
    except (KeyError, TypeError):
        raise UnknownCodecError(f"unknown compression {name!r}; known: {CODEC_NAMES}") from None


__all__ = ["CODEC_NAMES", "Codec", "get_codec"]
