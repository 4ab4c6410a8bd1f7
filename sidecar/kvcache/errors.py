"""Errors raised by the KV data model and its codecs.

Payloads and tables arrive from the network, so every way they can be wrong has a type:
callers catch `KVCodecError` to reject one object (or one catalog) without tearing down the
session, and tests can assert which check fired.
"""

from __future__ import annotations


class KVCodecError(ValueError):
    """Base of every error in `sidecar.kvcache`: bad input, never a bug in the codec."""


class LayoutError(KVCodecError):
    """A layout is out of bounds, or a serialised layout is malformed."""


class TensorError(KVCodecError):
    """A tensor handed to a codec has the wrong shape, dtype or device, or non-finite values."""


class PayloadError(KVCodecError):
    """A token payload is truncated, too long, of an unknown version or decodes to garbage."""


class TablesError(KVCodecError):
    """Shared codec tables are corrupt, of an unknown version, or do not match the layout."""


class UnknownCodecError(KVCodecError):
    """A track names a compression this build does not implement."""
