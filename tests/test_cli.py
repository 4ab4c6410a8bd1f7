"""The `kvmoq` console script as a user meets it: installed entry point, help, errors."""

from __future__ import annotations

import subprocess
import sys

import pytest


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


def torch_loaded_after(code: str) -> bool:
    """Whether running `code` in a fresh interpreter imports torch (2 s of a CLI's start)."""
    probe = (
        f"import sys\ntry:\n    {code}\nexcept SystemExit:\n    pass\nprint('torch' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    return result.stdout.strip().splitlines()[-1] == "True"


@pytest.mark.parametrize(
    "argv", [["relay", "--help"], ["token", "--help"], ["bench", "--help"], ["--version"]]
)
def test_named_subcommand_help_does_not_import_torch(argv: list[str]) -> None:
    assert not torch_loaded_after(f"from sidecar.cli import main; main({argv!r})")


def test_bench_parsers_import_their_module_only_when_chosen() -> None:
    code = "from sidecar.cli import build_parser; build_parser(['bench', 'relay', 'cert', 'demo'])"
    assert not torch_loaded_after(code)
    code = (
        "from sidecar.cli import build_parser; "
        "build_parser(['bench']).parse_args(['bench', 'transport', '--mbytes', '1'])"
    )
    assert not torch_loaded_after(code)


def test_full_parser_does_not_import_torch() -> None:
    assert not torch_loaded_after("from sidecar.cli import build_parser; build_parser()")


@pytest.mark.parametrize("bench", ["e2e", "vllm", "fanout"])
def test_a_packet_size_no_quic_stack_takes_is_refused_before_anything_starts(bench: str) -> None:
    result = run_kvmoq("bench", bench, "--max-datagram-size", "1000")
    assert result.returncode != 0
    assert f"kvmoq bench {bench}: --max-datagram-size must be in 1200..65527" in result.stderr
