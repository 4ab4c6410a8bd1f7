"""`kvmoq sidecar`: the process beside an inference server that moves its KV caches."""

from __future__ import annotations

import argparse
import functools
import json

_EPILOG = """\
The model server calls kvmoq.v1.KVCacheService (proto/kvmoq/v1) on the Unix socket
(mode 0660): it registers its KV buffers once (shared-memory or CUDA IPC handles; tensor
bytes never cross the socket), publishes prompts' KV and loads other prompts' KV into its
buffers. The same services, with grpc.health.v1 and reflection, listen on --probe for
Kubernetes gRPC probes. HTTP on --http: /healthz (alive), /readyz (relay session up),
/metrics (Prometheus).

Every setting comes, highest first, from its flag, from KVMOQ_<NAME> in the environment
(e.g. KVMOQ_RELAY, KVMOQ_CHUNK_SIZE), from the TOML file given by --config or
KVMOQ_CONFIG (keys as the flags, with underscores: chunk_size = 128), or its default.

Prints one JSON line {"event": "serving", "grpc": ..., "probe": ..., "http": ...} once
it serves (ports given as 0 are shown as bound). SIGTERM or SIGINT: health goes
NOT_SERVING, running loads get --drain-seconds, then are cancelled (their LoadFinished
still lists what was written) and the process exits 0.

  kvmoq sidecar --relay moqt://relay:4443 --ca certs/cert.pem \\
      --grpc unix:///run/kvmoq/sidecar.sock --probe 0.0.0.0:7070 --http 0.0.0.0:9464
"""


def register(sub: argparse._SubParsersAction) -> None:
    from sidecar.service.config import add_arguments

    parser = sub.add_parser(
        "sidecar",
        help="run the sidecar beside an inference server (gRPC API, MoQT to a relay)",
        description="Publish and load an inference server's KV caches over MoQT.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from sidecar.moqt.aio.transport import run as run_loop
    from sidecar.service.config import ConfigError, resolve
    from sidecar.service.server import run_sidecar
    from sidecar.tensors import open_handle

    try:
        config = resolve(args)
    except ConfigError as exc:
        print(f"kvmoq sidecar: {exc}")
        return 2

    def serving(addresses: dict[str, str]) -> None:
        print(json.dumps({"event": "serving", **addresses}), flush=True)

    opener = functools.partial(open_handle, shm_roots=config.shm_roots)
    run_loop(run_sidecar(config, opener, on_serving=serving))
    return 0
