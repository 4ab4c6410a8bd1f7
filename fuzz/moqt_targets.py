"""Fuzz targets of the MoQT wire: control messages, data streams, datagrams, SETUP's
parameters and the token a relay takes from them."""

from __future__ import annotations

import contextlib
from functools import cache

import jwt

from fuzz.targets import Target, pieces
from sidecar.jwk import generate
from sidecar.moqt.protocol import messages as m
from sidecar.moqt.protocol.data import (
    DataStreamParser,
    FetchHeader,
    FetchObject,
    ObjectBody,
    ObjectDatagram,
    SubgroupHeader,
    SubgroupObject,
    decode_datagram,
)
from sidecar.moqt.protocol.drafts import DRAFT_14, DRAFT_14_VERSION, DRAFT_16, DRAFT_18, DRAFTS
from sidecar.moqt.protocol.errors import NeedMoreData, ProtocolError
from sidecar.moqt.protocol.messages.base import decode_control
from sidecar.moqt.protocol.messages.parameters import SetupParameters, authorization_token
from sidecar.moqt.protocol.model import FullTrackName, GroupOrder
from sidecar.moqt.relay.auth import AuthError, Authorizer, sign


def control_stream(data: bytes) -> None:
    """Control messages back to back, arriving in pieces (session.py's loop), as every
    draft reads them (a draft that refuses the bytes leaves the next one to try)."""
    for draft in DRAFTS.values():
        buffer = bytearray()
        with contextlib.suppress(ProtocolError):
            for piece in pieces(data):
                buffer += piece
                while buffer:
                    try:
                        _, used = decode_control(bytes(buffer), draft)
                    except NeedMoreData:
                        break
                    del buffer[:used]


def data_stream(data: bytes) -> None:
    """One data stream arriving in pieces, as every draft reads it."""
    cut = pieces(data)
    for draft in DRAFTS.values():
        parser = DataStreamParser(max_payload=1 << 16, draft=draft)
        with contextlib.suppress(ProtocolError):
            for index, piece in enumerate(cut):
                parser.feed(piece, end_stream=index == len(cut) - 1)


def datagram(data: bytes) -> None:
    for draft in DRAFTS.values():
        with contextlib.suppress(ProtocolError):
            decode_datagram(data, draft)


def setup_parameters(data: bytes) -> None:
    """CLIENT_SETUP's parameters, then the token a relay takes from them."""
    from sidecar.moqt.protocol.wire import Reader

    parameters = SetupParameters.decode(Reader(data))
    _authorizer().grant(parameters, DRAFT_14)


@cache
def _authorizer_key() -> jwt.PyJWK:
    return jwt.PyJWK(generate("HS256"))


@cache
def _authorizer() -> Authorizer:
    return Authorizer(_authorizer_key(), public=None)


def _control_seeds() -> list[bytes]:
    setup = m.ClientSetup((DRAFT_14_VERSION,), SetupParameters(max_request_id=100, path=b"/x"))
    subscribe = m.Subscribe(
        1, FullTrackName((b"kvcache.moq.arpa/v1", b"m", b"p"), b"fp16"), 128,
        GroupOrder.ASCENDING, True, m.SubscriptionFilter(m.FilterType.LARGEST_OBJECT),
    )  # fmt: skip
    draft_16 = m.ClientSetup((), setup.parameters).encode(DRAFT_16) + subscribe.encode(DRAFT_16)
    draft_18 = m.Setup(m.SetupParameters(path=b"/x")).encode(DRAFT_18) + subscribe.encode(DRAFT_18)
    return [
        b"\x00" + setup.encode() + subscribe.encode(),
        b"\x03" + setup.encode(),
        b"\x00" + draft_16,
        b"\x00" + draft_18,
    ]


def _stream_seeds() -> list[bytes]:
    header = SubgroupHeader(track_alias=1, group_id=2, extensions=True)
    objects = [SubgroupObject(i, ObjectBody(bytes([i]) * 40, extensions=b"")) for i in range(3)]
    stream = header.encode() + b"".join(
        o.encode(header, i - 1 if i else None) for i, o in enumerate(objects)
    )
    fetched = [FetchObject(2, 0, i, body=ObjectBody(bytes([i]) * 40)) for i in range(3)]
    fetch_16, fetch_18 = (
        FetchHeader(4).encode(draft)
        + b"".join(o.encode(fetched[i - 1] if i else None, draft) for i, o in enumerate(fetched))
        for draft in (DRAFT_16, DRAFT_18)
    )
    return [b"\x07" + stream, b"\x00" + stream, b"\x03" + fetch_16, b"\x03" + fetch_18]


def _datagram_seeds() -> list[bytes]:
    return [ObjectDatagram(1, 2, 3, body=ObjectBody(b"payload")).encode()]


def _setup_seeds() -> list[bytes]:
    token = sign(_authorizer_key(), "kvcache.moq.arpa/v1", publish="", subscribe="")
    value = authorization_token(token.encode(), DRAFT_14)
    with_token = SetupParameters(authorization_tokens=(value,))
    return [with_token.encode(), SetupParameters(path=b"/?jwt=" + token.encode()).encode()]


TARGETS: dict[str, Target] = {
    "control_stream": Target(control_stream, (ProtocolError,), _control_seeds),
    "data_stream": Target(data_stream, (ProtocolError,), _stream_seeds),
    "datagram": Target(datagram, (ProtocolError, NeedMoreData), _datagram_seeds),
    "setup_and_token": Target(
        setup_parameters, (ProtocolError, NeedMoreData, AuthError), _setup_seeds
    ),
}
