"""Shared fixtures for real model data: SmolLM2-135M and the KV of a 4096-token pydoc prompt.

Session-scoped because loading the model and reading the KV cost seconds; the KV comes from
the disk cache (sidecar/models/kv_store.py), extracted once per machine. Tests that use them
are marked `model` (and `slow` where the first extraction may run).

Also a self-signed certificate per test module (`cert`), and relay processes
(tests/support/relay.py): one per test (`relay`) or one per module (`module_relay`).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator

import pytest
import torch
from transformers import PreTrainedModel

from sidecar.models import kv_store
from sidecar.models.smollm2 import load_model
from sidecar.moqt.aio.tls import CertificatePaths, write_certificate
from tests.support.relay import RelayProcess, running_relay

PROMPT_TOKENS = 4096

# vLLM engines started by the tests (and by the demo and bench they run) keep their engine
# core in their own process: 13 s to start instead of 37 s here, as one vLLM import is saved,
# and no second process polling beside the sidecars on 2 cores. Run by hand, the demo and
# the bench keep vLLM's default, a separate engine-core process, as `vllm serve` runs.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


PHASE = os.environ.get("KVMOQ_TEST_PHASE")
"""Set by scripts/test.sh: `shared` runs all but the `timing` tests (on several workers),
`timing` only those (in one process beside the others, which run niced, so what these
start gets the CPU when it asks); unset, everything runs."""

if os.environ.get("PYTEST_XDIST_WORKER"):
    # One torch thread per worker: with several workers on two cores, torch's default of
    # two threads each made them wait on each other at every op (model tests ran 3x slower).
    # The same for every process a test starts (a bench, a model server, a vLLM engine):
    # they inherit OMP_NUM_THREADS, which torch reads at start. vLLM's CPU worker binds its
    # own OpenMP threads, one to each core, unless told not to: with a core busy elsewhere
    # the vLLM tests took twice as long bound.
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"


def _interrupted(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: the unwinding is under way
    raise KeyboardInterrupt


def pytest_configure(config: pytest.Config) -> None:
    """SIGTERM unwinds pytest as Ctrl-C does, so the fixtures' teardowns stop the relays,
    sidecars and engines the tests started (scripts/test.sh stops its parts so when the run
    is interrupted). Ctrl-C is Python's again: scripts/test.sh runs pytest in the background,
    where a shell starts commands with SIGINT ignored, and every process a test starts would
    inherit that (the demo's Ctrl-C tests would find it deaf)."""
    signal.signal(signal.SIGTERM, _interrupted)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Tests marked `cuda` run where torch sees a CUDA GPU (scripts/gpu-check.sh)."""
    if item.get_closest_marker("cuda") is not None and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (scripts/gpu-check.sh runs it on one)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if PHASE is None:
        return
    wanted = PHASE == "timing"
    keep = [item for item in items if (item.get_closest_marker("timing") is not None) == wanted]
    config.hook.pytest_deselected(items=[item for item in items if item not in keep])
    items[:] = keep


@pytest.fixture(scope="session")
def smollm2() -> PreTrainedModel:
    return load_model()


@pytest.fixture(scope="session")
def pydoc_kv() -> kv_store.PromptKV:
    """Token ids, fp32 KV `[30, 2, 4096, 3, 64]` and last logits of the 4096-token pydoc prompt."""
    return kv_store.pydoc_kv(PROMPT_TOKENS)


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> CertificatePaths:
    return write_certificate(tmp_path_factory.mktemp("cert"))


def _relay_process(
    request: pytest.FixtureRequest, cert: CertificatePaths
) -> contextlib.AbstractContextManager[RelayProcess]:
    """A relay on aioquic, or on the stack a test or module parametrizing the fixture
    indirectly (RELAY_BACKENDS) names."""
    return running_relay(cert, backend=getattr(request, "param", "aioquic"))


@pytest.fixture
def relay(request: pytest.FixtureRequest, cert: CertificatePaths) -> Iterator[RelayProcess]:
    """A relay process of the test's own (it may kill it)."""
    with _relay_process(request, cert) as process:
        yield process


@pytest.fixture(scope="module")
def module_relay(request: pytest.FixtureRequest, cert: CertificatePaths) -> Iterator[RelayProcess]:
    """One relay process for a module's tests, which share it (and its cache)."""
    with _relay_process(request, cert) as process:
        yield process
