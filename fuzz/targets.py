"""One fuzz target per parser of outside bytes, and the errors each may raise for bad input.

Each target splits its input the way the parser meets bytes in the field (a control stream
in pieces, payloads of a chunk, a catalog behind its signature), so that the fuzzer reaches
the checks past the first length field.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import jwt
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from google.protobuf.message import DecodeError as ProtobufDecodeError
from kvmoq_client.v1 import kv_cache_pb2 as pb
from kvmoq_client.v1 import tensor_handle_pb2 as handle_pb

from sidecar.jwk import generate
from sidecar.kvcache.catalog import Catalog
from sidecar.kvcache.codecs import CODEC_NAMES, get_codec
from sidecar.kvcache.errors import KVCodecError
from sidecar.kvcache.layout import KVLayout
from sidecar.kvcache.signing import CatalogSigner, CatalogTrust
from sidecar.moqt.protocol import messages as m
from sidecar.moqt.protocol.data import (
    DataStreamParser,
    ObjectBody,
    ObjectDatagram,
    SubgroupHeader,
    SubgroupObject,
    decode_datagram,
)
from sidecar.moqt.protocol.errors import NeedMoreData, ProtocolError
from sidecar.moqt.protocol.messages.base import decode_control
from sidecar.moqt.protocol.messages.parameters import SetupParameters, authorization_token
from sidecar.moqt.protocol.model import FullTrackName, GroupOrder
from sidecar.moqt.relay.auth import AuthError, Authorizer, sign
from sidecar.service import messages
from sidecar.service.errors import RequestError
from sidecar.tensors.errors import HandleError
from sidecar.tensors.geometry import check_view, handle_dtype

LAYOUT = KVLayout(num_layers=2, num_kv_heads=2, head_dim=8, dtype="float16")


@dataclass(frozen=True, slots=True)
class Target:
    run: Callable[[bytes], None]
    expected: tuple[type[BaseException], ...]
    """What the parser raises for bad input: anything else is a crash."""
    seeds: Callable[[], list[bytes]]
    """Valid inputs to start from, so the fuzzer mutates real structure."""


def _pieces(data: bytes) -> list[bytes]:
    """The input cut where its first byte says, as QUIC may deliver a stream."""
    if not data:
        return []
    step = data[0] % 16 + 1
    body = data[1:]
    return [body[i : i + step] for i in range(0, len(body), step)]


def control_stream(data: bytes) -> None:
    """Control messages back to back, arriving in pieces (session.py's loop)."""
    buffer = bytearray()
    for piece in _pieces(data):
        buffer += piece
        while buffer:
            try:
                _, used = decode_control(bytes(buffer))
            except NeedMoreData:
                break
            del buffer[:used]


def data_stream(data: bytes) -> None:
    parser = DataStreamParser(max_payload=1 << 16)
    pieces = _pieces(data)
    for index, piece in enumerate(pieces):
        parser.feed(piece, end_stream=index == len(pieces) - 1)


def datagram(data: bytes) -> None:
    decode_datagram(data)


def setup_parameters(data: bytes) -> None:
    """CLIENT_SETUP's parameters, then the token a relay takes from them."""
    from sidecar.moqt.protocol.wire import Reader

    parameters = SetupParameters.decode(Reader(data))
    _authorizer().grant(parameters)


@cache
def _authorizer_key() -> jwt.PyJWK:
    return jwt.PyJWK(generate("HS256"))


@cache
def _authorizer() -> Authorizer:
    return Authorizer(_authorizer_key(), public=None)


@cache
def _trust() -> tuple[CatalogSigner, CatalogTrust]:
    key = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
    return CatalogSigner(key), CatalogTrust.of([key.public_key()])


def catalog(data: bytes) -> None:
    """A catalog object as a subscriber without keys takes it."""
    Catalog.decode(CatalogTrust().open(data))


def signed_catalog(data: bytes) -> None:
    """A catalog object checked against a trusted key; the input either signed here (so
    the fuzzer explores the catalog parser past a valid signature) or taken as it is."""
    signer, trust = _trust()
    body = signer.seal(data[1:]) if data[:1] == b"S" else data
    Catalog.decode(trust.open(body))


def payloads(data: bytes) -> None:
    """A chunk's token payloads on any track: the first byte picks the codec, the rest is
    cut into one payload per token."""
    if not data:
        return
    name = CODEC_NAMES[data[0] % len(CODEC_NAMES)]
    codec = get_codec(name)
    body = data[1:]
    size = max(1, len(body) // 3)
    chunk = [body[i : i + size] for i in range(0, len(body), size)] or [b""]
    codec.decode(chunk, LAYOUT, _tables(name))


@cache
def _tables(name: str) -> bytes | None:
    generator = torch.Generator().manual_seed(0)
    sample = torch.randn(LAYOUT.shape(16), generator=generator).to(torch.float16)
    return get_codec(name).fit_tables(LAYOUT, sample)


def ac_tables(data: bytes) -> None:
    """`ac` tables as a catalog carries them, then a token decoded with them."""
    get_codec("ac").decode([data[:64]], LAYOUT, data[64:])


def grpc_requests(data: bytes) -> None:
    """A RegisterBuffers or Load request's bytes, then every field the sidecar reads."""
    if data[:1] == b"L":
        load = pb.LoadRequest.FromString(data[1:])
        messages.placement(load.destination, "destination")
        return
    request = pb.RegisterBuffersRequest.FromString(data)
    messages.layout(request.layout)
    messages.arrangement(request)
    for buffer in request.buffers:
        handle = messages.tensor_handle(buffer.handle, "buffer")
        dtype = handle_dtype(handle.dtype)
        check_view(dtype, handle.shape, handle.stride, offset_elements=0, capacity_bytes=1 << 40)


def _control_seeds() -> list[bytes]:
    setup = m.ClientSetup((m.DRAFT_14,), SetupParameters(max_request_id=100, path=b"/x"))
    subscribe = m.Subscribe(
        1, FullTrackName((b"kvcache.moq.arpa/v1", b"m", b"p"), b"fp16"), 128,
        GroupOrder.ASCENDING, True, m.SubscriptionFilter(m.FilterType.LARGEST_OBJECT),
    )  # fmt: skip
    return [b"\x00" + setup.encode() + subscribe.encode(), b"\x03" + setup.encode()]


def _stream_seeds() -> list[bytes]:
    header = SubgroupHeader(track_alias=1, group_id=2, extensions=True)
    objects = [SubgroupObject(i, ObjectBody(bytes([i]) * 40, extensions=b"")) for i in range(3)]
    stream = header.encode() + b"".join(
        o.encode(header, i - 1 if i else None) for i, o in enumerate(objects)
    )
    return [b"\x07" + stream, b"\x00" + stream]


def _datagram_seeds() -> list[bytes]:
    return [ObjectDatagram(1, 2, 3, body=ObjectBody(b"payload")).encode()]


def _setup_seeds() -> list[bytes]:
    token = sign(_authorizer_key(), "kvcache.moq.arpa/v1", publish="", subscribe="")
    with_token = SetupParameters(authorization_tokens=(authorization_token(token.encode()),))
    return [with_token.encode(), SetupParameters(path=b"/?jwt=" + token.encode()).encode()]


def _vector_catalog() -> bytes:
    first = Catalog.for_prompt("demo/model", LAYOUT, [1, 2, 3, 4, 5], {"int8": None}, 4)
    return first.with_chunk({"int8": [b"\x01\x02"] * 4}).encode()


def _payload_seeds() -> list[bytes]:
    generator = torch.Generator().manual_seed(1)
    kv = torch.randn(LAYOUT.shape(3), generator=generator).to(torch.float16)
    return [
        bytes([index]) + b"".join(get_codec(name).encode(kv, LAYOUT, _tables(name)))
        for index, name in enumerate(CODEC_NAMES)
    ]


def _ac_seeds() -> list[bytes]:
    payload = _payload_seeds()[CODEC_NAMES.index("ac")][1:]
    tables = _tables("ac")
    assert tables is not None
    return [payload[:64].ljust(64, b"\x00") + tables]


def _grpc_seeds() -> list[bytes]:
    handle = handle_pb.TensorHandle(
        shared_memory=handle_pb.SharedMemoryHandle(
            path="/dev/shm/kv",
            size=4096,
            dtype=handle_pb.DTYPE_FLOAT16,
            shape=[8, 16],
            stride=[16, 1],
        )
    )
    register = pb.RegisterBuffersRequest(
        layout=pb.KVLayout(num_layers=2, num_kv_heads=2, head_dim=8, dtype=handle_pb.DTYPE_FLOAT16),
        contiguous=pb.ContiguousLayout(max_tokens=64),
        buffers=[pb.KVBuffer(layer=0, part=pb.KV_PART_KEY_VALUE, handle=handle)],
    )
    load = pb.LoadRequest(
        buffer_set_id="s", token_ids=[1, 2], destination=pb.KVLocation(
            blocks=pb.BlockList(block_ids=[0, 1])
        ),
    )  # fmt: skip
    return [register.SerializeToString(), b"L" + load.SerializeToString()]


TARGETS: dict[str, Target] = {
    "control_stream": Target(control_stream, (ProtocolError,), _control_seeds),
    "data_stream": Target(data_stream, (ProtocolError,), _stream_seeds),
    "datagram": Target(datagram, (ProtocolError, NeedMoreData), _datagram_seeds),
    "setup_and_token": Target(
        setup_parameters, (ProtocolError, NeedMoreData, AuthError), _setup_seeds
    ),
    "catalog": Target(catalog, (KVCodecError,), lambda: [_vector_catalog()]),
    "signed_catalog": Target(
        signed_catalog,
        (KVCodecError,),
        lambda: [b"S" + _vector_catalog(), _trust()[0].seal(_vector_catalog())],
    ),
    "payloads": Target(payloads, (KVCodecError,), _payload_seeds),
    "ac_tables": Target(ac_tables, (KVCodecError,), _ac_seeds),
    "grpc_requests": Target(
        grpc_requests,
        (ProtobufDecodeError, RequestError, HandleError, KVCodecError),
        _grpc_seeds,
    ),
}
