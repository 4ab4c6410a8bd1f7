"""TRACK_STATUS family: SUBSCRIBE's layouts under other codes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .base import _register, _RequestError, _SubscribeLayout, _SubscribeOkLayout


@_register
@dataclass(frozen=True, slots=True)
class TrackStatus(_SubscribeLayout):
    TYPE: ClassVar[int] = 0x0D


@_register
@dataclass(frozen=True, slots=True)
class TrackStatusOk(_SubscribeOkLayout):
    """Same layout as SUBSCRIBE_OK; ``track_alias`` is always 0."""

    TYPE: ClassVar[int] = 0x0E
    ALLOW_DEFAULT_ORDER: ClassVar[bool] = True


@_register
@dataclass(frozen=True, slots=True)
class TrackStatusError(_RequestError):
    TYPE: ClassVar[int] = 0x0F
