"""aiomoqt's own interop suite (`moq_interop_client`, the MoQT working group's runner
client) against `kvmoq relay` as users start it: no flags but the address and a throwaway
certificate, on the sidecar's Python (3.11: aioquic or qh3) and on the relay's own (3.12:
aiopquic), then on each QUIC stack.

Every case aiomoqt runs at drafts 18, 16 and 14 must pass; the ones it skips are the later
drafts'. A relay on qh3 often fails picoquic clients' handshakes (aiomoqt's QUIC stack is
picoquic: "packet builder capacity exhausted" in qh3 2.1's transmit, sessions set up in
4.4 s), which is why the relay's default leaves qh3 last (`quic_backend.RELAY_PREFERENCE`; docs/reliability.md). It is
not tested here: it fails only some of the time, so no assertion on it can be both true today
and fail the day a qh3 release fixes it.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.address import free_udp_port
from tests.interop.harness import AIOMOQT_PYTHON
from tests.support.relay import RELAY_PYTHON

pytestmark = [
    pytest.mark.interop,
    pytest.mark.skipif(not AIOMOQT_PYTHON.exists(), reason=f"needs {AIOMOQT_PYTHON} (setup.sh)"),
]

LATER_DRAFTS = {
    18: set(),
    16: {"rendezvous-timeout"},
    14: {"rendezvous-timeout", "subscribe-namespace-lifecycle"},
}
"""Per draft the relay speaks, the cases aiomoqt runs only at later drafts (16 or 18), so
skips there."""
RELAY_START_S = 60.0
SUITE_S = 120.0


@contextlib.contextmanager
def kvmoq_relay(python: str | Path, *flags: str) -> Iterator[str]:
    """`kvmoq relay --listen 127.0.0.1:PORT --self-signed` and `flags`; yields its URL."""
    argv = [str(python), "-m", "sidecar.cli", "relay", "--self-signed",
            "--listen", f"127.0.0.1:{free_udp_port()}", *flags]  # fmt: skip
    relay = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert relay.stdout is not None
        line = relay.stdout.readline()
        assert line.startswith("listening on "), relay.stderr and relay.stderr.read()[-2000:]
        yield line.removeprefix("listening on ").strip()
    finally:
        relay.terminate()
        relay.wait(RELAY_START_S)


def interop_suite(url: str, draft: int = 14, *only: str) -> dict[str, str]:
    """Each case's outcome as aiomoqt's TAP output gives it: ok, not ok, or skip."""
    argv = [str(AIOMOQT_PYTHON), "-m", "aiomoqt.tools.moq_interop_client", "-r", url,
            "--draft", str(draft), "--tls-disable-verify", *(f"--test={t}" for t in only)]  # fmt: skip
    result = subprocess.run(argv, capture_output=True, text=True, timeout=SUITE_S, check=False)
    outcomes = {}
    for line in result.stdout.splitlines():
        found = re.match(r"(ok|not ok) \d+ - (\S+)( # SKIP)?", line)
        if found:
            outcomes[found[2]] = "skip" if found[3] else found[1]
    assert outcomes, result.stdout[-2000:] + result.stderr[-2000:]
    assert f'moqt_version: "moqt-{draft}"' in result.stdout  # what aiomoqt negotiated
    return outcomes


def assert_every_suite_passes(url: str) -> None:
    """aiomoqt's suite at each draft the relay speaks by default."""
    for draft in LATER_DRAFTS:
        assert_every_case_passes(interop_suite(url, draft), draft)


def assert_every_case_passes(outcomes: dict[str, str], draft: int) -> None:
    failed = sorted(case for case, outcome in outcomes.items() if outcome == "not ok")
    skipped = {case for case, outcome in outcomes.items() if outcome == "skip"}
    assert not failed, f"aiomoqt's cases failed at draft {draft}: {failed}"
    assert skipped <= LATER_DRAFTS[draft], skipped - LATER_DRAFTS[draft]
    assert len(outcomes) - len(skipped) >= 10


@pytest.mark.parametrize(
    "python",
    [
        pytest.param(sys.executable, id="sidecar-python"),
        pytest.param(
            RELAY_PYTHON,
            id="relay-python",
            marks=pytest.mark.skipif(not RELAY_PYTHON.exists(), reason="no .venv-relay"),
        ),
    ],
)
def test_the_default_relay_passes_aiomoqts_suite(python: str | Path) -> None:
    with kvmoq_relay(python) as url:
        assert_every_suite_passes(url)


def test_a_relay_on_aioquic_passes_aiomoqts_suite() -> None:
    with kvmoq_relay(sys.executable, "--backend", "aioquic") as url:
        assert_every_suite_passes(url)


@pytest.mark.skipif(not RELAY_PYTHON.exists(), reason="aiopquic runs in .venv-relay")
def test_a_relay_on_aiopquic_passes_aiomoqts_suite() -> None:
    with kvmoq_relay(RELAY_PYTHON, "--backend", "aiopquic") as url:
        assert_every_suite_passes(url)
