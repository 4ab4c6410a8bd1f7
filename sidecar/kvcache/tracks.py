"""The track names of a prompt's KV and the defaults a publisher offers.

Kept apart from the codecs (which import torch) so that command lines and config files can
check track names without loading torch: `kvmoq --help` builds every subcommand's options.
"""

from __future__ import annotations

from .errors import UnknownCodecError

CODEC_NAMES: tuple[str, ...] = ("fp16", "bf16", "fp8", "int8", "fp4", "int4", "ac")
"""One track per compression (`sidecar.kvcache.codecs` has a codec for each)."""

DEFAULT_TRACKS: tuple[str, ...] = ("fp16", "int8", "ac", "int4")
"""A spread the deadline rule can choose from: near-lossless, 8 bits, ~3 bits, 4 bits."""

DEFAULT_TRACK = "int8"
"""Encoded eagerly: the usual choice on a datacenter link (see transfer.adapt)."""


def parse_codec_names(text: str) -> tuple[str, ...]:
    """Track names from a comma-separated list, as command lines and config files give them.

    `UnknownCodecError` names every unknown entry at once (or says the list is empty), so a
    user fixes a flag in one go.
    """
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in CODEC_NAMES]
    if not names or unknown:
        raise UnknownCodecError(
            f"unknown compression {', '.join(unknown) or '(none)'}; "
            f"choose from {' '.join(CODEC_NAMES)}"
        )
    return names
