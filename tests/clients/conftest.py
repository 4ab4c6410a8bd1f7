"""A relay process and two `kvmoq sidecar` processes per test module, started as an operator
would: one beside a prefill model server, one beside a decode model server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.moqt.aio.tls import CertificatePaths
from tests.support.relay import RelayProcess
from tests.support.sidecar import CHUNK, SidecarProcess, running_sidecar, shm_directory


@pytest.fixture(scope="module")
def prefill(module_relay: RelayProcess, cert: CertificatePaths) -> Iterator[SidecarProcess]:
    """The sidecar of the model server that computes and publishes prompts."""
    with running_sidecar(module_relay.url, cert, "--chunk-size", str(CHUNK)) as process:
        process.wait_ready()
        yield process


@pytest.fixture(scope="module")
def decode(module_relay: RelayProcess, cert: CertificatePaths) -> Iterator[SidecarProcess]:
    """The sidecar of another model server, which loads what `prefill` published."""
    with running_sidecar(module_relay.url, cert, "--chunk-size", str(CHUNK)) as process:
        process.wait_ready()
        yield process


@pytest.fixture
def shm() -> Iterator[Path]:
    with shm_directory() as directory:
        yield directory
