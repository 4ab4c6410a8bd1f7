"""Namespace routing: longest published prefix, newest publisher, bounded tables."""

from __future__ import annotations

import pytest

from sidecar.moqt.protocol.model import has_prefix
from sidecar.moqt.relay.routing import NamespaceTable, RoutingLimitExceeded


def test_the_longest_published_prefix_wins() -> None:
    table: NamespaceTable[str] = NamespaceTable(10, 10)
    table.add_publisher((b"kv",), "broad")
    table.add_publisher((b"kv", b"model"), "narrow")
    assert table.route((b"kv", b"model", b"prompt")) == "narrow"
    assert table.route((b"kv", b"other")) == "broad"
    assert table.route((b"elsewhere",)) is None
    assert table.route((b"k",)) is None  # fields match whole, not by bytes


def test_a_namespace_is_gone_only_with_its_last_publisher() -> None:
    table: NamespaceTable[str] = NamespaceTable(10, 10)
    assert table.add_publisher((b"kv",), "first")
    assert not table.add_publisher((b"kv",), "second")
    assert table.route((b"kv",)) == "second"
    assert not table.remove_publisher((b"kv",), "second")
    assert table.route((b"kv",)) == "first"
    assert table.remove_peer("first") == [(b"kv",)]
    assert table.route((b"kv",)) is None


def test_followers_hear_of_namespaces_under_their_prefixes() -> None:
    table: NamespaceTable[str] = NamespaceTable(10, 10)
    table.add_prefix("all", ())
    table.add_prefix("kv", (b"kv",))
    assert sorted(table.interested_in((b"kv", b"m"))) == ["all", "kv"]
    assert table.interested_in((b"video",)) == ["all"]
    table.add_publisher((b"kv", b"m"), "pub")
    assert table.published_under((b"kv",)) == [(b"kv", b"m")]
    assert has_prefix((b"kv", b"m"), ())


def test_tables_are_bounded() -> None:
    table: NamespaceTable[str] = NamespaceTable(2, 1)
    table.add_publisher((b"a",), "p")
    table.add_publisher((b"b",), "p")
    with pytest.raises(RoutingLimitExceeded):
        table.add_publisher((b"c",), "p")
    table.add_prefix("f", (b"a",))
    with pytest.raises(RoutingLimitExceeded):
        table.add_prefix("f", (b"b",))
