"""Every fuzz target (fuzz/targets.py names them) for a bounded run under atheris: a parser
of outside bytes that raises anything but its documented errors fails here, with the input."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest

from fuzz.targets import TARGETS
from tests.support.relay import REPO

RUN_SECONDS = 3
GROWTH_LIMIT_MB = 2048
"""libFuzzer's memory limit, above where the target starts: Linux hands a child its parent's
peak RSS across fork and exec (a suite that loaded a model is gigabytes), and libFuzzer
checks that figure against its limit."""


@pytest.mark.slow
@pytest.mark.parametrize("target", sorted(TARGETS))
def test_fuzz_target_finds_no_crash(target: str, tmp_path: Path) -> None:
    inherited_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    done = subprocess.run(
        [
            *(sys.executable, "-m", "fuzz", target, f"-max_total_time={RUN_SECONDS}"),
            f"-rss_limit_mb={inherited_mb + GROWTH_LIMIT_MB}",
            f"-artifact_prefix={tmp_path}/",
        ],
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
