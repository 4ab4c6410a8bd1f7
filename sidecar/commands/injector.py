"""`kvmoq injector`: the mutating admission webhook that injects the sidecar into pods."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from sidecar.address import parse_address

_EPILOG = """\
The Kubernetes API server calls POST /inject with an admission.k8s.io/v1 AdmissionReview for
every pod created in the namespaces the MutatingWebhookConfiguration selects. A pod labelled
kvmoq.io/inject: "true" gets the sidecar as the Helm chart renders it (--template: the
chart's <release>-kvmoq-injection ConfigMap), its socket and shared-memory volumes, and
KVMOQ_GRPC in every container. Other pods, and pods injected already, are left as they are.

Annotations change one pod's sidecar:
  kvmoq.io/relay-url        moqt://HOST:PORT of another relay
  kvmoq.io/tracks           the tracks it publishes and loads, e.g. "fp16,int8"
  kvmoq.io/resources        the sidecar's resources, JSON: {"limits": {"memory": "12Gi"}}
  kvmoq.io/cuda-ipc         "true": share the PID namespace and the model server's GPU
                            (its DRA claims, else NVIDIA_VISIBLE_DEVICES)
  kvmoq.io/visible-devices  NVIDIA_VISIBLE_DEVICES of the sidecar under cuda-ipc
  kvmoq.io/vllm-container   the vLLM container: it gets --kv-transfer-config for the kvmoq
                            connector, pointed at the sidecar's socket
  kvmoq.io/vllm-role        kv_producer, kv_consumer or kv_both (default)
  kvmoq.io/vllm-config      more kv_connector_extra_config, JSON: {"load_deadline": 2}
A pod whose annotations are wrong, or that cannot take the sidecar (a volume or mount of
the sidecar's already there), is refused with a message that says why.

GET /healthz and /readyz answer 200. Prints {"event": "serving", "url": ...} once it
serves; SIGTERM or SIGINT stops it. The certificate is read again when its files change.

  kvmoq injector --listen 0.0.0.0:8443 --cert /tls/tls.crt --key /tls/tls.key \\
      --template /etc/kvmoq-injection/template.json
"""


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "injector",
        help="serve the Kubernetes webhook that injects the sidecar into labelled pods",
        description="Inject the kvmoq sidecar into pods labelled kvmoq.io/inject=true.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--listen", type=parse_address, default=("0.0.0.0", 8443), metavar="HOST:PORT",
        help="where to serve HTTPS (default 0.0.0.0:8443)",
    )  # fmt: skip
    parser.add_argument("--cert", type=Path, required=True, metavar="FILE",
                        help="the serving certificate (PEM); its CA is the webhook's caBundle")  # fmt: skip
    parser.add_argument("--key", type=Path, required=True, metavar="FILE",
                        help="its private key (PEM)")  # fmt: skip
    parser.add_argument(
        "--template", type=Path, required=True, metavar="FILE",
        help="what to inject: template.json of the chart's injection ConfigMap",
    )  # fmt: skip
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from sidecar.injector.server import ReloadingTLS, serve
    from sidecar.injector.template import InjectionTemplate, TemplateError

    try:
        template = InjectionTemplate.load(args.template)
        tls = ReloadingTLS(args.cert, args.key)
    except (OSError, TemplateError) as exc:
        print(f"kvmoq injector: {exc}")
        return 2

    def serving(url: str) -> None:
        print(json.dumps({"event": "serving", "url": url}), flush=True)

    serve(args.listen, tls, template, serving)
    return 0
