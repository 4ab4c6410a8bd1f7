"""bench.netns: the namespace, its link limit and its removal, checked on this kernel."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bench import netns

# Measures a link's rate: scripts/test.sh runs it alone (see there).
pytestmark = pytest.mark.timing

needs_root = pytest.mark.skipif(
    netns.unavailable_reason() is not None, reason=str(netns.unavailable_reason())
)


def namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def rate_inside(namespace: netns.Namespace) -> float:
    """A bulk transfer's rate inside the namespace, checked against its loopback counter."""
    code = (
        "from bench.netns import loopback_bytes, loopback_rate\n"
        "before = loopback_bytes()\n"
        "print(loopback_rate(1.0), loopback_bytes() - before)"
    )
    argv = namespace.exec_argv([sys.executable, "-c", code])
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
    rate, counted = (float(figure) for figure in done.stdout.split())
    assert counted >= 0.9 * rate / 8  # the sender wrote for 1 s; every byte crossed `lo`
    return rate


def test_link_limits_parse_as_tc_writes_them() -> None:
    assert netns.LinkLimit.parse("100mbit") == netns.LinkLimit("100mbit", 100_000_000)
    assert netns.LinkLimit.parse(" 1Gbit ").bits_per_second == 1_000_000_000
    for bad in ("100", "fast", "0mbit", "1.5gbit", "100mbps"):
        with pytest.raises(ValueError):
            netns.LinkLimit.parse(bad)


def test_the_bucket_holds_a_whole_loopback_packet_at_any_rate() -> None:
    args = netns.LinkLimit.parse("1kbit").tbf_args()
    assert int(args[args.index("burst") + 1]) >= 65536


@needs_root
def test_a_limit_holds_inside_the_namespace_and_lifts() -> None:
    with netns.Namespace() as namespace:
        assert namespace.name in namespaces()
        namespace.limit(netns.LinkLimit.parse("100mbit"))
        limited = rate_inside(namespace)
        assert 80e6 < limited < 105e6
        namespace.limit(None)
        assert rate_inside(namespace) > 2 * limited
    assert namespace.name not in namespaces()


@needs_root
def test_the_namespace_and_its_processes_go_on_failure() -> None:
    with pytest.raises(RuntimeError), netns.Namespace() as namespace:
        sleeper = subprocess.Popen(namespace.exec_argv(["sleep", "600"]))
        raise RuntimeError("the benchmark failed")
    assert sleeper.wait(timeout=30) != 0
    assert namespace.name not in namespaces()
