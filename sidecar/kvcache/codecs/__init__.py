"""One module per compression of a token's KV; `get_codec(name)` maps a track name to it."""

from __future__ import annotations

from ..errors import UnknownCodecError
from .ac import AC
from .base import Codec
from .bf16 import BF16
from .fp4 import FP4
from .fp8 import FP8
from .fp16 import FP16
from .int4 import INT4
from .int8 import INT8

CODEC_NAMES = ("fp16", "bf16", "fp8", "int8", "fp4", "int4", "ac")

_CODECS: dict[str, Codec] = {codec.name: codec for codec in (FP16, BF16, FP8, INT8, FP4, INT4, AC)}


def get_codec(name: str) -> Codec:
    """The codec for a track name; `UnknownCodecError` for anything not in CODEC_NAMES."""
    try:
        return _CODECS[name]
    except (KeyError, TypeError):
        raise UnknownCodecError(f"unknown compression {name!r}; known: {CODEC_NAMES}") from None


def parse_codec_names(text: str) -> tuple[str, ...]:
    """Track names from a comma-separated list, as command lines and config files give them.

    `UnknownCodecError` names every unknown entry at once (or says the list is empty), so a
    user fixes a flag in one go.
    """
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in _CODECS]
    if not names or unknown:
        raise UnknownCodecError(
            f"unknown compression {', '.join(unknown) or '(none)'}; "
            f"choose from {' '.join(CODEC_NAMES)}"
        )
    return names


__all__ = ["CODEC_NAMES", "Codec", "get_codec", "parse_codec_names"]
