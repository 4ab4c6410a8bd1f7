"""Publisher -> relay -> subscriber through combinations of moq-rs and aiomoqt.

These prove the harness and map what the two independent implementations agree on. A chain
that cannot work is a `KnownBug`: an expected failure only when it fails with the documented
error (any other failure fails the test), and a failure when it works, so a fix upstream
shows up and README.md gets updated; see "Incompatibilities" there.
"""

from __future__ import annotations

import dataclasses

import pytest

from tests.interop.harness import StartPeer
from tests.interop.scenario import KnownBug, TrackSpec, known_bug, received, relay_chain

KINDS = ("moqrs", "aiomoqt")
CHAINS = [(pub, relay, sub) for pub in KINDS for relay in KINDS for sub in KINDS]


def chain_id(chain: tuple[str, ...]) -> str:
    return "-".join(chain)


def expected_version(client: str, relay: str) -> str:
    """moq-rs prefers moq-lite when both ends are moq-rs; every other pair lands on draft-14."""
    return "moq-lite" if client == relay == "moqrs" else "moq-transport-14"


@pytest.mark.interop
@pytest.mark.parametrize(("pub", "relay", "sub"), CHAINS, ids=map(chain_id, CHAINS))
def test_every_object_arrives_intact(start_peer: StartPeer, pub: str, relay: str, sub: str) -> None:
    spec = TrackSpec()
    _, publisher, subscriber = relay_chain(start_peer, pub, relay, sub, spec)
    subscriber.expect_success(timeout=spec.timeout + 10)

    assert received(subscriber) == spec.expected()
    assert str(publisher.version).startswith(expected_version(pub, relay))
    assert str(subscriber.version).startswith(expected_version(sub, relay))


_PUBLISH_REFUSED = KnownBug(
    "publisher",
    r"PUBLISH is not supported",
    "moq-rs answers PUBLISH with PUBLISH_ERROR 0x3 'PUBLISH is not supported'",
)
PUBLISH_FLOW = [
    pytest.param("moqrs", "aiomoqt", _PUBLISH_REFUSED, id="moqrs-relay-aiomoqt-sub"),
    pytest.param("moqrs", "moqrs", _PUBLISH_REFUSED, id="moqrs-relay-moqrs-sub"),
    pytest.param("aiomoqt", "aiomoqt", None, id="aiomoqt-relay"),
    pytest.param(
        "aiomoqt",
        "moqrs",
        dataclasses.replace(_PUBLISH_REFUSED, peer="relay"),
        id="aiomoqt-relay-moqrs-sub",
    ),
]


@pytest.mark.interop
@pytest.mark.parametrize(("relay", "sub", "bug"), PUBLISH_FLOW)
def test_publish_flow(start_peer: StartPeer, relay: str, sub: str, bug: KnownBug | None) -> None:
    """aiomoqt announcing its track with PUBLISH (no PUBLISH_NAMESPACE) instead."""
    spec = TrackSpec(namespace="kvtest/publish", timeout=6.0)
    relay_peer, publisher, subscriber = relay_chain(
        start_peer, "aiomoqt", relay, sub, spec, mode="publish"
    )
    with known_bug(bug, relay=relay_peer, publisher=publisher, subscriber=subscriber):
        subscriber.expect_success(timeout=spec.timeout + 10)
    assert received(subscriber) == spec.expected()


LARGE_CHAINS = [
    ("aiomoqt", "moqrs", "moqrs"),
    ("aiomoqt", "moqrs", "aiomoqt"),
    ("moqrs", "aiomoqt", "aiomoqt"),
    ("aiomoqt", "aiomoqt", "moqrs"),
]


@pytest.mark.interop
@pytest.mark.parametrize(("pub", "relay", "sub"), LARGE_CHAINS, ids=map(chain_id, LARGE_CHAINS))
def test_kv_sized_objects(start_peer: StartPeer, pub: str, relay: str, sub: str) -> None:
    """Objects of the size of one token's K and V for a whole model (hundreds of KiB)."""
    spec = TrackSpec(namespace="kvtest/large", groups=2, objects=3, sizes=[600_000, 1, 250_000])
    _, _, subscriber = relay_chain(start_peer, pub, relay, sub, spec)
    subscriber.expect_success(timeout=spec.timeout + 10)

    assert received(subscriber) == spec.expected()


KV_NAMESPACE = r"kvcache.moq.arpa\/v1/smollm2/abc123"
"""("kvcache.moq.arpa/v1", "smollm2", "abc123"): the first field holds a '/'. aiomoqt's string
form and moq-rs's broadcast path both write it as '\\/' inside a field."""

SLASH_CHAINS = [(relay, sub) for relay in KINDS for sub in KINDS]


@pytest.mark.interop
@pytest.mark.parametrize(("relay", "sub"), SLASH_CHAINS, ids=map(chain_id, SLASH_CHAINS))
def test_namespace_field_with_slash(start_peer: StartPeer, relay: str, sub: str) -> None:
    """The kvcache namespace keeps its three fields through either relay, to either client."""
    spec = TrackSpec(namespace=KV_NAMESPACE, track="fp16", groups=2, objects=2, sizes=[64])
    _, _, subscriber = relay_chain(start_peer, "aiomoqt", relay, sub, spec)
    subscriber.expect_success(timeout=spec.timeout + 10)

    assert received(subscriber) == spec.expected()


EXTENSIONS = "32=7,33=6b76"
"""Object extension headers 0x20 = 7 and 0x21 = b"kv", types no one knows."""


def extensions_seen(start_peer: StartPeer, relay: str) -> list[dict[str, object]]:
    """The extension headers of every object, aiomoqt -> relay -> aiomoqt."""
    spec = TrackSpec(namespace="kvtest/ext", groups=2, objects=2, sizes=[64])
    _, _, subscriber = relay_chain(
        start_peer, "aiomoqt", relay, "aiomoqt", spec, extensions=EXTENSIONS
    )
    subscriber.expect_success(timeout=spec.timeout + 10)
    assert received(subscriber) == spec.expected()
    return [event["extensions"] for event in subscriber.events("extensions")]


@pytest.mark.interop
def test_aiomoqt_relay_forwards_unknown_extensions(start_peer: StartPeer) -> None:
    seen = extensions_seen(start_peer, "aiomoqt")

    assert seen == [{"32": 7, "33": "6b76"}] * 4


@pytest.mark.interop
def test_moqrs_relay_replaces_extensions_with_its_timestamp(start_peer: StartPeer) -> None:
    """moq-rs keeps no extension headers: it re-frames objects and stamps LOC time (0x10)."""
    seen = extensions_seen(start_peer, "moqrs")

    assert len(seen) == 4
    assert all(set(extensions) == {"16"} for extensions in seen)
