"""The relay as `pip install kvmoq` installs it: the relay's dependencies only, no torch, on
Python 3.12 (.venv-relay, made by scripts/setup.sh as the relay image's recipe does).

The sidecar is tied to Python 3.11 by the CPU torch wheel; the relay is not, so it can run on
the newer Python the native QUIC stacks need. These tests run that relay as a process and
move a prompt's KV through it from this (3.11) interpreter, byte for byte."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sidecar.address import free_udp_port
from sidecar.cli import SIDECAR_EXTRA
from sidecar.kvcache.codecs import get_codec
from sidecar.kvcache.layout import KVLayout
from sidecar.moqt.aio.quic_backend import BACKENDS
from sidecar.moqt.aio.tls import CertificatePaths
from sidecar.transfer.subscriber import StopReason
from sidecar.transfer.track_quality import TrackChoice
from tests.support.aio import run
from tests.support.kv_net import MODEL, network, synthetic_kv
from tests.support.relay import RELAY_PYTHON, running_relay

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(
    not RELAY_PYTHON.exists(), reason="no .venv-relay (scripts/setup.sh makes it with Python 3.12)"
)

LAYOUT = KVLayout(num_layers=2, num_kv_heads=2, head_dim=64, dtype="float16")


def in_relay_env(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(RELAY_PYTHON), *argv], capture_output=True, text=True, timeout=60, cwd=ROOT
    )


def test_the_relay_environment_is_python_3_12_without_torch() -> None:
    probe = in_relay_env(
        "-c",
        "import sys, importlib.util; "
        "print(*sys.version_info[:2], importlib.util.find_spec('torch') is None)",
    )
    assert probe.stdout.split() == ["3", "12", "True"], probe.stdout + probe.stderr


def test_commands_that_need_the_sidecar_say_what_to_install() -> None:
    usage = in_relay_env("-m", "sidecar.cli", "--help")
    assert usage.returncode == 0, usage.stderr
    for command in ("relay", "sidecar", "demo", "bench", "injector", "token", "cert"):
        assert command in usage.stdout
    for argv in (
        ["sidecar", "--relay", "moqt://127.0.0.1:1", "--grpc", "unix:///nonexistent.sock"],
        ["demo"],
        ["bench", "e2e"],
        ["injector", "--listen", "127.0.0.1:0", "--cert", "c", "--key", "k", "--template", "t"],
    ):
        refused = in_relay_env("-m", "sidecar.cli", *argv)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert f"pip install '{SIDECAR_EXTRA}'" in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_prompt_loads_through_the_relay_on_python_3_12(
    cert: CertificatePaths, backend: str
) -> None:
    ids = list(range(5000, 5000 + 3 * 128))
    kv = synthetic_kv(len(ids), LAYOUT, seed=4).to(torch.float16)
    with running_relay(cert, python=RELAY_PYTHON, backend=backend) as relay:

        async def main() -> None:
            async with network(relay.url, cert, relay.settings) as net:
                await net.published(LAYOUT, ids, kv, tracks=("fp16", "int8"), chunk_size=128)
                subscriber = await net.subscriber()
                for track in ("fp16", "int8"):
                    loaded = torch.zeros(LAYOUT.shape(len(ids)), dtype=torch.float16)
                    result = await subscriber.load(
                        MODEL, ids, loaded, 30, choice=TrackChoice.only(track)
                    )
                    assert result.stopped is StopReason.COMPLETE, result
                    assert result.prefix_tokens == len(ids)
                    codec = get_codec(track)
                    expected = codec.decode(codec.encode(kv, LAYOUT), LAYOUT)
                    assert torch.equal(loaded, expected.to(torch.float16)), track

        run(main)


@pytest.mark.parametrize(
    ("python", "flags", "chosen"),
    [
        (RELAY_PYTHON, (), "aiopquic"),
        (RELAY_PYTHON, ("--max-datagram-size", "16384"), "aioquic"),
        (sys.executable, (), "aioquic"),  # qh3 fails picoquic clients (RELAY_PREFERENCE)
    ],
    ids=["3.12-internet", "3.12-loopback", "3.11-internet"],
)
def test_without_backend_the_relay_runs_the_fastest_installed_for_its_packets(
    cert: CertificatePaths, python: Path, flags: tuple[str, ...], chosen: str
) -> None:
    argv = [str(python), "-m", "sidecar.cli", "relay", "--listen", f"127.0.0.1:{free_udp_port()}"]
    argv += ["--cert", str(cert.cert), "--key", str(cert.key), *flags]
    relay = subprocess.Popen(
        argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert relay.stdout is not None and relay.stdout.readline().startswith("listening on ")
    finally:
        relay.terminate()
        _, log = relay.communicate(timeout=30)
    started = next(json.loads(line) for line in log.splitlines() if "relay started" in line)
    assert started["backend"] == chosen


def test_a_self_sized_stack_refuses_packets_bigger_than_ethernet() -> None:
    refused = in_relay_env(
        "-m",
        "sidecar.cli",
        "relay",
        "--listen",
        "127.0.0.1:4443",
        "--self-signed",
        "--backend",
        "aiopquic",
        "--max-datagram-size",
        "16384",
    )
    assert refused.returncode == 2
    assert "use aioquic or qh3 for --max-datagram-size above 1500" in refused.stdout
