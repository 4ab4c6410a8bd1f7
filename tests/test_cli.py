"""The `kvmoq` console script as a user meets it: installed entry point, help, errors."""

from __future__ import annotations

import subprocess
import sys


def run_kvmoq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sidecar.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_help_lists_subcommands() -> None:
    result = run_kvmoq("--help")
    assert result.returncode == 0
    assert "bench" in result.stdout


def test_missing_subcommand_is_a_usage_error() -> None:
    result = run_kvmoq()
    assert result.returncode == 2
    assert "required" in result.stderr


def test_version() -> None:
    result = run_kvmoq("--version")
    assert result.returncode == 0
    assert result.stdout.startswith("kvmoq ")
