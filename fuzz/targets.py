"""One fuzz target per parser of outside bytes, and the errors each may raise for bad input.

Each target splits its input the way the parser meets bytes in the field (a control stream
in pieces, payloads of a chunk, a catalog behind its signature), so that the fuzzer reaches
the checks past the first length field. The targets live in one module per area
(`moqt_targets`, `kv_targets`, `grpc_targets`), and `python -m fuzz` imports only the one
its target is in: atheris instruments every sidecar module imported, and importing all of
them (torch, the service) would cost every run seconds before its first input.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Target:
    run: Callable[[bytes], None]
    expected: tuple[type[BaseException], ...]
    """What the parser raises for bad input: anything else is a crash."""
    seeds: Callable[[], list[bytes]]
    """Valid inputs to start from, so the fuzzer mutates real structure."""


TARGETS: dict[str, str] = {
    "control_stream": "fuzz.moqt_targets",
    "data_stream": "fuzz.moqt_targets",
    "datagram": "fuzz.moqt_targets",
    "setup_and_token": "fuzz.moqt_targets",
    "catalog": "fuzz.kv_targets",
    "signed_catalog": "fuzz.kv_targets",
    "payloads": "fuzz.kv_targets",
    "ac_tables": "fuzz.kv_targets",
    "grpc_requests": "fuzz.grpc_targets",
}
"""Every target's name, and the module that defines it (in its own `TARGETS`)."""


def load(name: str) -> Target:
    """The target `name`, importing only its module."""
    target: Target = importlib.import_module(TARGETS[name]).TARGETS[name]
    return target


def pieces(data: bytes) -> list[bytes]:
    """The input cut where its first byte says, as QUIC may deliver a stream."""
    if not data:
        return []
    step = data[0] % 16 + 1
    body = data[1:]
    return [body[i : i + step] for i in range(0, len(body), step)]
