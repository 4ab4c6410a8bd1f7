"""The container image's recipe, exercised without a container engine: the Containerfile's
Python environment is made by scripts/image-env.sh, and this test runs that same script into
a scratch directory, then the CLI and a relay from what it installed."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from dataclasses import dataclass
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
    assert (
        "RUN KVMOQ_PYTHON=python${PYTHON} KVMOQ_TORCH_INDEX=${TORCH_INDEX} \\\n"
        "    scripts/image-env.sh /opt/kvmoq ${IMAGE}"
    ) in text
    copied = re.findall(r"^COPY (?!--from)(.+) \S+$", text, flags=re.MULTILINE)
    sources = {path for line in copied for path in line.split()}
    # What image-env.sh installs from: both distributions, the script and its pins.
    assert {"pyproject.toml", "README.md", "sidecar", "bench", "clients/python"} <= sources
    assert {"scripts/image-env.sh", "scripts/constraints.txt"} <= sources
    final = text[text.rindex("\nFROM ") :]
    assert "USER 10001" in final and "pip" not in final


def test_one_version_names_the_image_the_chart_and_the_package() -> None:
    chart = yaml.safe_load((ROOT / "helm" / "kvmoq" / "Chart.yaml").read_text())
    values = yaml.safe_load((ROOT / "helm" / "kvmoq" / "values.yaml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert chart["appVersion"] == values["image"]["tag"] == project["version"] == __version__


RELAY_PYTHON = os.environ.get("KVMOQ_PYTHON312", "/root/.pyenv/versions/3.12.1/bin/python")


@dataclass(frozen=True)
class Image:
    role: str
    python: str
    """The interpreter image-env.sh makes the venv with, as the image's base has it."""
    modules: tuple[str, ...]
    """What it installs, importable from the venv."""
    absent: tuple[str, ...]
    """What it must not install."""


IMAGES = [
    Image("sidecar", "python3.11", ("sidecar", "kvmoq_client", "torch"), ()),
    Image("relay", RELAY_PYTHON, ("sidecar", "aiopquic"), ("torch", "kvmoq_client", "grpc")),
]


@pytest.mark.slow
@pytest.mark.parametrize("image", IMAGES, ids=lambda image: image.role)
def test_the_image_environment_runs_the_cli_and_a_relay(tmp_path: Path, image: Image) -> None:
    if not shutil.which(image.python):
        pytest.skip(f"no {image.python}")
    prefix = tmp_path / "opt-kvmoq"
    env = {key: value for key, value in os.environ.items() if key != "VIRTUAL_ENV"}
    result = subprocess.run(
        [str(ROOT / "scripts" / "image-env.sh"), str(prefix), image.role],
        capture_output=True, text=True, timeout=INSTALL_S, check=False,
        env={**env, "KVMOQ_PYTHON": image.python},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    kvmoq = prefix / "bin" / "kvmoq"
    # Installed, not linked to this tree: the image has no sources.
    probe = (
        "import importlib.util; "
        f"print(*[importlib.util.find_spec(m).origin for m in {image.modules!r}]); "
        f"print(*[importlib.util.find_spec(m) is None for m in {image.absent!r}])"
    )
    installed, absent = subprocess.run(
        [str(prefix / "bin" / "python"), "-c", probe],
        capture_output=True, text=True, check=True, cwd=tmp_path,
    ).stdout.split("\n")[:2]  # fmt: skip
    assert all(path.startswith(str(prefix)) for path in installed.split()), installed
    assert set(absent.split()) <= {"True"}, absent
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
