"""The container image's recipe, exercised without a container engine: the Containerfile's
Python environment is made by scripts/image-env.sh, and this test runs that same script into
a scratch directory, then the CLI and a relay from what it installed."""

from __future__ import annotations

import os
import re
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from sidecar import __version__
from sidecar.address import free_udp_port
from sidecar.demo.children import Children

ROOT = Path(__file__).resolve().parents[1]
CONTAINERFILE = ROOT / "Containerfile"
INSTALL_S = 900
START_S = 60.0


def test_the_containerfile_builds_its_environment_with_the_tested_script() -> None:
    text = CONTAINERFILE.read_text()
    assert "RUN KVMOQ_TORCH_INDEX=${TORCH_INDEX} scripts/image-env.sh /opt/kvmoq" in text
    copied = re.findall(r"^COPY (?!--from)(.+) \S+$", text, flags=re.MULTILINE)
    sources = {path for line in copied for path in line.split()}
    # What image-env.sh installs from: both distributions and the script itself.
    assert {"pyproject.toml", "README.md", "sidecar", "bench", "clients/python"} <= sources
    assert "scripts/image-env.sh" in sources
    final = text[text.rindex("\nFROM ") :]
    assert "USER 10001" in final and "pip" not in final


def test_one_version_names_the_image_the_chart_and_the_package() -> None:
    chart = yaml.safe_load((ROOT / "helm" / "kvmoq" / "Chart.yaml").read_text())
    values = yaml.safe_load((ROOT / "helm" / "kvmoq" / "values.yaml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert chart["appVersion"] == values["image"]["tag"] == project["version"] == __version__


@pytest.mark.slow
def test_the_image_environment_runs_the_cli_and_a_relay(tmp_path: Path) -> None:
    prefix = tmp_path / "opt-kvmoq"
    env = {key: value for key, value in os.environ.items() if key != "VIRTUAL_ENV"}
    result = subprocess.run(
        [str(ROOT / "scripts" / "image-env.sh"), str(prefix)],
        capture_output=True, text=True, timeout=INSTALL_S, check=False, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    kvmoq = prefix / "bin" / "kvmoq"
    # Installed, not linked to this tree: the image has no sources.
    where = subprocess.run(
        [str(prefix / "bin" / "python"), "-c", "import sidecar, kvmoq_client; "
         "print(sidecar.__file__); print(kvmoq_client.__file__)"],
        capture_output=True, text=True, check=True, cwd=tmp_path,
    ).stdout.split()  # fmt: skip
    assert all(path.startswith(str(prefix)) for path in where), where
    usage = subprocess.run(
        [str(kvmoq), "--help"], capture_output=True, text=True, check=True, cwd=tmp_path
    )
    for command in ("sidecar", "relay", "injector", "token", "cert"):
        assert command in usage.stdout
    port = free_udp_port()
    with Children() as children:
        relay = children.start(
            "relay",
            [str(kvmoq), "relay", "--listen", f"127.0.0.1:{port}", "--self-signed"],
            ready_prefix=f"listening on moqt://127.0.0.1:{port}",
            timeout=START_S,
        )
        assert relay.process.poll() is None
