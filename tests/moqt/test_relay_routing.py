"""Namespace routing (longest published prefix, newest publisher) and namespace followers,
in bounded tables."""

from __future__ import annotations

import pytest

from sidecar.moqt.protocol.model import has_prefix
from sidecar.moqt.protocol.origin import Followers, TooManyPrefixes
from sidecar.moqt.relay.routing import NamespaceTable, RoutingLimitExceeded


def test_the_longest_published_prefix_wins() -> None:
    table: NamespaceTable[str] = NamespaceTable(10)
    table.add_publisher((b"kv",), "broad")
    table.add_publisher((b"kv", b"model"), "narrow")
    assert table.route((b"kv", b"model", b"prompt")) == "narrow"
    assert table.route((b"kv", b"other")) == "broad"
    assert table.route((b"elsewhere",)) is None
    assert table.route((b"k",)) is None  # fields match whole, not by bytes


def test_a_namespace_is_gone_only_with_its_last_publisher() -> None:
    table: NamespaceTable[str] = NamespaceTable(10)
    assert table.add_publisher((b"kv",), "first")
    assert not table.add_publisher((b"kv",), "second")
    assert table.route((b"kv",)) == "second"
    assert not table.remove_publisher((b"kv",), "second")
    assert table.route((b"kv",)) == "first"
    assert table.remove_peer("first") == [(b"kv",)]
    assert table.route((b"kv",)) is None


def test_followers_hear_of_namespaces_under_their_prefixes() -> None:
    followers = Followers(10)
    followers.add("all", ())  # type: ignore[arg-type]
    followers.add("kv", (b"kv",))  # type: ignore[arg-type]
    assert sorted(followers.of((b"kv", b"m"))) == ["all", "kv"]  # type: ignore[type-var]
    assert followers.of((b"video",)) == ["all"]
    followers.forget("all")  # type: ignore[arg-type]
    assert followers.of((b"video",)) == []
    table: NamespaceTable[str] = NamespaceTable(10)
    table.add_publisher((b"kv", b"m"), "pub")
    assert table.published_under((b"kv",)) == [(b"kv", b"m")]
    assert has_prefix((b"kv", b"m"), ())


def test_tables_are_bounded() -> None:
    table: NamespaceTable[str] = NamespaceTable(2)
    table.add_publisher((b"a",), "p")
    table.add_publisher((b"b",), "p")
    with pytest.raises(RoutingLimitExceeded):
        table.add_publisher((b"c",), "p")
    followers = Followers(1)
    followers.add("f", (b"a",))  # type: ignore[arg-type]
    with pytest.raises(TooManyPrefixes):
        followers.add("f", (b"b",))  # type: ignore[arg-type]
