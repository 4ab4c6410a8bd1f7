"""Track lists as flags give them: every codec name accepted, every mistake named at once."""

from __future__ import annotations

import pytest

from sidecar.kvcache.errors import UnknownCodecError
from sidecar.kvcache.tracks import CODEC_NAMES, parse_codec_names


def test_every_codec_name_parses_in_order_with_blanks_dropped() -> None:
    text = " , ".join(reversed(CODEC_NAMES)) + ",,"
    assert parse_codec_names(text) == tuple(reversed(CODEC_NAMES))


def test_unknown_names_are_all_named() -> None:
    with pytest.raises(UnknownCodecError, match="unknown compression zip, lz4;"):
        parse_codec_names("int8,zip,lz4")


def test_an_empty_list_is_refused() -> None:
    with pytest.raises(UnknownCodecError, match=r"\(none\)"):
        parse_codec_names(" , ")
