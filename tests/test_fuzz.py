"""Every fuzz target (fuzz/targets.py) for a bounded run under atheris: a parser of outside
bytes that raises anything but its documented errors fails here, with the input."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fuzz.targets import TARGETS
from tests.moqt.test_relay_harness import REPO

RUN_SECONDS = 3


@pytest.mark.slow
@pytest.mark.parametrize("target", sorted(TARGETS))
def test_fuzz_target_finds_no_crash(target: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "fuzz", target, f"-max_total_time={RUN_SECONDS}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "INITED" in done.stderr and "Done" in done.stderr


def test_an_unknown_target_is_refused() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "fuzz", "nonsense"], cwd=REPO, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and "targets: control_stream" in done.stdout
