"""kvmoq's relay between independent publishers and subscribers (aiomoqt, moq-rs).

The relay runs as `kvmoq relay`, registered in the interop harness as peer kind "kvmoq" (on
aioquic, Python 3.11) and "kvmoq-default" (no backend named, on the relay's own install,
Python 3.12, as the image runs it: the defaults pick aiopquic there, which its ready line
must say).
The harness hands every relay `--port/--cert/--key`; a two-line adapter turns those into
`--listen 127.0.0.1:PORT`, and the relay's "relay started" log line (stderr) marks it ready.
The relay keeps its default 1350-byte QUIC packets: picoquic (under aiomoqt) drops larger
ones, and aioquic does not lower its packet size to the peer's max_udp_payload_size.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tests.interop.conftest import StartPeer
from tests.interop.harness import KVMOQ_RELAY_DRAFT, PROGRAMS, Program
from tests.interop.scenario import TrackSpec, discovery_chain, received, relay_chain
from tests.support.relay import RELAY_PYTHON

READY = re.compile(r"relay started")
_ADAPTER = (
    "import sys; from sidecar.cli import main; f = dict(zip(sys.argv[1::2], sys.argv[2::2])); "
    "sys.exit(main(['relay', '--listen', '127.0.0.1:' + f.pop('--port'), '--cert', "
    "f.pop('--cert'), '--key', f.pop('--key'), *(x for kv in f.items() for x in kv)]))"
)
PROGRAMS[("kvmoq", "relay")] = Program(
    Path(sys.executable), ("-c", _ADAPTER, "--backend", "aioquic"), ready_stderr=READY
)
PROGRAMS[("kvmoq-default", "relay")] = Program(
    RELAY_PYTHON, ("-c", _ADAPTER), ready_stderr=re.compile(r'"backend": "aiopquic".*relay started')
)
OLDER = {"kvmoq-14": "14", "kvmoq-16": "16,14"}
"""Relays held to older drafts (`--drafts`), by name."""
for _name, _drafts in OLDER.items():
    PROGRAMS[(_name, "relay")] = Program(
        Path(sys.executable), ("-c", _ADAPTER, "--backend", "aioquic", "--drafts", _drafts),
        ready_stderr=READY,
    )  # fmt: skip
RELAYS = ("kvmoq", "kvmoq-default")
"""kvmoq's relay on aioquic (Python 3.11, as the sidecar) and as users run it (3.12)."""

KINDS = ("aiomoqt", "moqrs")
CHAINS = [(pub, relay, sub) for relay in RELAYS for pub in KINDS for sub in KINDS]
CHAINS += [("moqrs", older, "moqrs") for older in OLDER]
"""moq-rs speaks drafts 14 to 18: it takes the newest a relay offers (18 by default; 16 or
14 where the relay is held to them)."""


@pytest.mark.interop
@pytest.mark.parametrize(("pub", "relay", "sub"), CHAINS, ids=["-".join(c) for c in CHAINS])
def test_objects_cross_the_kvmoq_relay_intact(
    start_peer: StartPeer, pub: str, relay: str, sub: str
) -> None:
    spec = TrackSpec(namespace="kvtest/kvmoq")
    _, publisher, subscriber = relay_chain(start_peer, pub, relay, sub, spec)
    subscriber.expect_success(timeout=spec.timeout + 10)
    assert received(subscriber) == spec.expected()
    for kind, peer in ((pub, publisher), (sub, subscriber)):
        newest = OLDER[relay].split(",")[0] if relay in OLDER else None
        draft = KVMOQ_RELAY_DRAFT[kind] if newest is None else f"moq-transport-{newest}"
        assert str(peer.version).startswith(draft)


@pytest.mark.interop
@pytest.mark.parametrize("relay", RELAYS)
@pytest.mark.parametrize("publisher_stays", [True, False], ids=["publisher-up", "publisher-gone"])
def test_aiomoqt_fetch_is_served_from_the_kvmoq_cache(
    start_peer: StartPeer, publisher_stays: bool, relay: str
) -> None:
    """A subscriber pulls the track through the relay; a FETCH of every group then comes
    from the relay's cache, also once the publisher has left."""
    spec = TrackSpec(namespace="kvtest/kvmoq-fetch", objects=2, sizes=[100, 20_000], timeout=15.0)
    relay_peer, publisher, subscriber = relay_chain(start_peer, "aiomoqt", relay, "aiomoqt", spec)
    subscriber.expect_success(timeout=spec.timeout + 10)
    if not publisher_stays:
        publisher.stop()
    fetch = start_peer("aiomoqt", "fetch", url=relay_peer.url, **spec.params())
    fetch.expect_success(timeout=spec.timeout + 10)
    assert received(fetch) == spec.expected()
    assert len(publisher.events("produced")) == 1


@pytest.mark.interop
def test_a_namespace_subscriber_is_offered_a_pushed_track(start_peer: StartPeer) -> None:
    """draft-14 discovery: an aiomoqt subscriber that knows only the namespace follows it; an
    aiomoqt publisher then PUBLISHes its track to the relay, which offers it to the follower
    with PUBLISH, and every object reaches it."""
    spec = TrackSpec(namespace="kvtest/discover", timeout=15.0)
    relay = start_peer("kvmoq", "relay")
    relay.wait_ready()
    subscriber = discovery_chain(start_peer, relay.url, relay.url, spec)
    subscriber.expect_success(timeout=spec.timeout + 10)
    assert received(subscriber) == spec.expected()
    assert subscriber.events("ready")[0]["track"] == spec.track  # learnt from the PUBLISH
