"""Hypothesis strategies for every MoQT control message and data-plane item."""

from __future__ import annotations

from hypothesis import strategies as st

from sidecar.moqt.protocol import messages as m
from sidecar.moqt.protocol.data import (
    FetchObject,
    ObjectBody,
    ObjectDatagram,
    SubgroupHeader,
    SubgroupIdMode,
    SubgroupObject,
)
from sidecar.moqt.protocol.drafts import DRAFT_14, Draft
from sidecar.moqt.protocol.model import FullTrackName, GroupOrder, Location, ObjectStatus
from sidecar.moqt.protocol.wire import MAX_VARINT, encode_kvps

varints = st.one_of(
    st.integers(0, 63),
    st.integers(0, 0x3FFF),
    st.integers(0, 0x3FFFFFFF),
    st.integers(0, MAX_VARINT),
)
small = st.integers(0, 10_000)
u8 = st.integers(0, 255)
fields = st.binary(max_size=12)
namespaces = st.lists(fields, min_size=1, max_size=32).map(tuple)
tracks = st.builds(FullTrackName, namespaces, st.binary(max_size=20))
locations = st.builds(Location, varints, varints)
reasons = st.text(max_size=40)
group_orders = st.sampled_from(GroupOrder)
chosen_orders = st.sampled_from([GroupOrder.ASCENDING, GroupOrder.DESCENDING])


def _pairs(known: frozenset[int]) -> st.SearchStrategy[tuple[tuple[int, int | bytes], ...]]:
    keys = varints.filter(lambda k: k not in known)
    pair = keys.flatmap(
        lambda k: st.tuples(st.just(k), varints if k % 2 == 0 else st.binary(max_size=16))
    )
    return st.lists(pair, max_size=4).map(tuple)


kvp_lists = _pairs(frozenset())
extensions = kvp_lists.map(encode_kvps)

setup_parameters = st.builds(
    m.SetupParameters,
    unknown=_pairs(frozenset(m.SetupParameters._KEYS)),
    path=st.none() | fields,
    max_request_id=st.none() | varints,
    authorization_tokens=st.lists(fields, max_size=2).map(tuple),
    max_auth_token_cache_size=st.none() | varints,
    authority=st.none() | fields,
    implementation=st.none() | fields,
)
parameters = st.builds(
    m.Parameters,
    unknown=_pairs(frozenset(m.Parameters._KEYS)),
    delivery_timeout=st.none() | varints,
    authorization_tokens=st.lists(fields, max_size=2).map(tuple),
    max_cache_duration=st.none() | varints,
)


@st.composite
def filters(draw: st.DrawFn) -> m.SubscriptionFilter:
    filter_type = draw(st.sampled_from(m.FilterType))
    if filter_type in (m.FilterType.NEXT_GROUP_START, m.FilterType.LARGEST_OBJECT):
        return m.SubscriptionFilter(filter_type)
    start = draw(st.builds(Location, small, small))
    if filter_type == m.FilterType.ABSOLUTE_START:
        return m.SubscriptionFilter(filter_type, start)
    return m.SubscriptionFilter(filter_type, start, draw(st.integers(start.group, 20_000)))


@st.composite
def fetch_targets(draw: st.DrawFn) -> m.StandaloneFetch | m.JoiningFetch:
    if draw(st.booleans()):
        return m.JoiningFetch(draw(varints), draw(varints), draw(st.booleans()))
    start = draw(st.builds(Location, small, small))
    end_group = draw(st.integers(start.group, 20_000))
    end_object = draw(
        st.none() | st.integers(start.object if end_group == start.group else 0, 20_000)
    )
    return m.StandaloneFetch(draw(tracks), start, end_group, end_object)


_subscribe_fields = {
    "request_id": varints,
    "track": tracks,
    "subscriber_priority": u8,
    "group_order": group_orders,
    "forward": st.booleans(),
    "filter": filters(),
    "parameters": parameters,
}
_subscribe_ok_fields = {
    "request_id": varints,
    "track_alias": varints,
    "expires": varints,
    "group_order": chosen_orders,
    "largest": st.none() | locations,
    "parameters": parameters,
}
_error_fields = {"request_id": varints, "error_code": varints, "reason": reasons}

MESSAGE_STRATEGIES: dict[type[m.ControlMessage], st.SearchStrategy[m.ControlMessage]] = {
    m.ClientSetup: st.builds(
        m.ClientSetup, st.lists(varints, max_size=4).map(tuple), setup_parameters
    ),
    m.ServerSetup: st.builds(m.ServerSetup, varints, setup_parameters),
    m.Goaway: st.builds(m.Goaway, st.binary(max_size=64)),
    m.MaxRequestId: st.builds(m.MaxRequestId, varints),
    m.RequestsBlocked: st.builds(m.RequestsBlocked, varints),
    m.Subscribe: st.builds(m.Subscribe, **_subscribe_fields),
    m.SubscribeOk: st.builds(m.SubscribeOk, **_subscribe_ok_fields),
    m.SubscribeError: st.builds(m.SubscribeError, **_error_fields),
    m.SubscribeUpdate: st.builds(
        m.SubscribeUpdate,
        request_id=varints,
        subscription_request_id=varints,
        start=locations,
        end_group=st.none() | st.integers(0, MAX_VARINT - 1),
        subscriber_priority=u8,
        forward=st.booleans(),
        parameters=parameters,
    ),
    m.Unsubscribe: st.builds(m.Unsubscribe, varints),
    m.PublishDone: st.builds(m.PublishDone, varints, varints, varints, reasons),
    m.Publish: st.builds(
        m.Publish,
        request_id=varints,
        track=tracks,
        track_alias=varints,
        group_order=chosen_orders,
        largest=st.none() | locations,
        forward=st.booleans(),
        parameters=parameters,
    ),
    m.PublishOk: st.builds(
        m.PublishOk,
        request_id=varints,
        forward=st.booleans(),
        subscriber_priority=u8,
        group_order=group_orders,
        filter=filters(),
        parameters=parameters,
    ),
    m.PublishError: st.builds(m.PublishError, **_error_fields),
    m.Fetch: st.builds(
        m.Fetch,
        request_id=varints,
        target=fetch_targets(),
        subscriber_priority=u8,
        group_order=group_orders,
        parameters=parameters,
    ),
    m.FetchOk: st.builds(
        m.FetchOk,
        request_id=varints,
        end=locations,
        end_of_track=st.booleans(),
        group_order=chosen_orders,
        parameters=parameters,
    ),
    m.FetchError: st.builds(m.FetchError, **_error_fields),
    m.FetchCancel: st.builds(m.FetchCancel, varints),
    m.TrackStatus: st.builds(m.TrackStatus, **_subscribe_fields),
    m.TrackStatusOk: st.builds(
        m.TrackStatusOk, **{**_subscribe_ok_fields, "group_order": group_orders}
    ),
    m.TrackStatusError: st.builds(m.TrackStatusError, **_error_fields),
    m.PublishNamespace: st.builds(m.PublishNamespace, varints, namespaces, parameters),
    m.PublishNamespaceOk: st.builds(m.PublishNamespaceOk, varints),
    m.PublishNamespaceError: st.builds(m.PublishNamespaceError, **_error_fields),
    m.PublishNamespaceDone: st.builds(m.PublishNamespaceDone, namespaces),
    m.PublishNamespaceCancel: st.builds(m.PublishNamespaceCancel, namespaces, varints, reasons),
    m.SubscribeNamespace: st.builds(
        m.SubscribeNamespace, varints, st.just(()) | namespaces, parameters
    ),
    m.SubscribeNamespaceOk: st.builds(m.SubscribeNamespaceOk, varints),
    m.SubscribeNamespaceError: st.builds(m.SubscribeNamespaceError, **_error_fields),
    m.UnsubscribeNamespace: st.builds(m.UnsubscribeNamespace, st.just(()) | namespaces),
    m.RequestOk: st.builds(m.RequestOk, varints, varints, st.none() | locations, parameters),
    m.RequestError: st.builds(m.RequestError, varints, varints, varints, reasons),
    m.Namespace: st.builds(m.Namespace, st.just(()) | namespaces),
    m.NamespaceDone: st.builds(m.NamespaceDone, st.just(()) | namespaces),
}
_BY_REQUEST_ID = {
    m.PublishNamespaceDone: st.builds(m.PublishNamespaceDone, st.just(()), varints),
    m.PublishNamespaceCancel: st.builds(
        m.PublishNamespaceCancel, st.just(()), varints, reasons, varints
    ),
    m.SubscribeNamespace: st.builds(
        m.SubscribeNamespace,
        varints,
        st.just(()) | namespaces,
        parameters,
        st.sampled_from(m.NamespaceOptions),
    ),
}
"""Where a later draft's form carries what draft 14's does not (request ids, options)."""
_DRAFT_18 = {
    m.Setup: st.builds(m.Setup, setup_parameters),
    m.SubscribeTracks: st.builds(m.SubscribeTracks, varints, st.just(()) | namespaces, parameters),
    m.Goaway: st.builds(m.Goaway, st.binary(max_size=64), varints, st.none() | varints),
    m.Subscribe: st.builds(
        m.Subscribe,
        **{
            **_subscribe_fields,
            "parameters": st.builds(
                m.Parameters,
                authorization_tokens=st.lists(st.binary(max_size=8), max_size=2).map(tuple),
                rendezvous_timeout=st.none() | varints,
            ),
        },
    ),
}
"""What draft 18 adds: its SETUP, SUBSCRIBE_TRACKS, GOAWAY's timeout and request id, the
rendezvous."""


def strategies_of(
    draft: Draft,
) -> dict[type[m.ControlMessage], st.SearchStrategy[m.ControlMessage]]:
    """Per message class a session of `draft` can send, its strategy."""
    chosen = MESSAGE_STRATEGIES if draft == DRAFT_14 else {**MESSAGE_STRATEGIES, **_BY_REQUEST_ID}
    if draft.request_streams:
        chosen = {**chosen, **_DRAFT_18}
    return {cls: s for cls, s in chosen.items() if cls.spoken_in(draft)}


def messages_of(draft: Draft) -> st.SearchStrategy[m.ControlMessage]:
    """Any message a session of `draft` can send."""
    return st.one_of(*strategies_of(draft).values())


messages = messages_of(DRAFT_14)


@st.composite
def object_bodies(draw: st.DrawFn, with_extensions: bool = True) -> ObjectBody:
    status = draw(st.sampled_from(ObjectStatus))
    ext = draw(extensions) if with_extensions and status != ObjectStatus.DOES_NOT_EXIST else b""
    payload = draw(st.binary(max_size=300)) if status == ObjectStatus.NORMAL else b""
    return ObjectBody(payload, status, ext)


@st.composite
def subgroup_headers(draw: st.DrawFn) -> SubgroupHeader:
    mode = draw(st.sampled_from(SubgroupIdMode))
    subgroup_id = {SubgroupIdMode.ZERO: 0, SubgroupIdMode.FIRST_OBJECT: None}.get(
        mode, draw(varints)
    )
    return SubgroupHeader(
        draw(varints),
        draw(varints),
        subgroup_id,
        draw(u8),
        draw(st.booleans()),
        draw(st.booleans()),
        mode,
    )


@st.composite
def subgroup_streams(draw: st.DrawFn) -> tuple[SubgroupHeader, list[SubgroupObject]]:
    header = draw(subgroup_headers())
    ids = sorted(draw(st.sets(st.integers(0, 5000), max_size=6)))
    bodies = [draw(object_bodies(header.extensions)) for _ in ids]
    return header, [SubgroupObject(i, b) for i, b in zip(ids, bodies, strict=True)]


fetch_objects = st.builds(FetchObject, varints, varints, varints, u8, object_bodies())


@st.composite
def datagrams(draw: st.DrawFn) -> ObjectDatagram:
    body = draw(object_bodies())
    if body.status == ObjectStatus.NORMAL and not body.payload and draw(st.booleans()):
        body = ObjectBody(draw(st.binary(min_size=1, max_size=50)), body.status, body.extensions)
    end_of_group = body.status == ObjectStatus.NORMAL and draw(st.booleans())
    return ObjectDatagram(draw(varints), draw(varints), draw(varints), draw(u8), body, end_of_group)
