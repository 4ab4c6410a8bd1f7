"""What the injector adds to a pod, as the Helm chart renders it.

The chart renders its named templates (`kvmoq.sidecarContainer`, `kvmoq.sidecarVolumes`,
`kvmoq.modelServerEnv`, `kvmoq.modelServerMounts`) into a ConfigMap, the one the injector
reads at start: the sidecar a webhook injects is then the sidecar the chart's own
`inference` Deployment carries, from one source, with the chart's values (relay URL, CA,
tokens, keys, resources) already applied. Per-pod annotations adjust it afterwards
(`pod_options`).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SIDECAR_NAME = "kvmoq-sidecar"
MAX_TEMPLATE_BYTES = 1 << 20
GRPC_ENV = "KVMOQ_GRPC"
RELAY_ENV = "KVMOQ_RELAY"
TRACKS_ENV = "KVMOQ_TRACKS"
VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"
"""The variables of the sidecar (`kvmoq sidecar --help`) and of the NVIDIA runtime that
pod annotations set."""
SOCKET_VOLUME = "kvmoq-socket"
SHM_VOLUME = "kvmoq-shm"
SHM_PATH = "/dev/shm"

Json = dict[str, Any]


class TemplateError(ValueError):
    """The template file is not what the chart renders."""


@dataclass(frozen=True)
class InjectionTemplate:
    sidecar: Json
    """The sidecar container (name `kvmoq-sidecar`); with `restartPolicy: Always` when native."""
    native: bool
    """A native sidecar (an init container that keeps running) or a plain second container."""
    volumes: list[Json]
    """The socket and shared-memory volumes, and the Secrets the sidecar mounts."""
    model_server_env: list[Json]
    """What every container of the pod gets to find the sidecar (KVMOQ_GRPC)."""
    model_server_mounts: list[Json]
    """The socket directory and /dev/shm, mounted in every container of the pod."""
    pod_annotations: dict[str, str]
    """Annotations the pod gets unless it sets them itself: Prometheus' scrape annotations
    for the sidecar's metrics port, as the chart's own inference pods carry them."""
    visible_devices: str
    """NVIDIA_VISIBLE_DEVICES of the sidecar in a CUDA IPC pod whose containers claim no
    DRA devices (the chart's inference.cudaIPC.sidecarVisibleDevices); empty: such a pod is
    refused."""

    @classmethod
    def load(cls, path: Path) -> InjectionTemplate:
        with path.open("rb") as file:
            text = file.read(MAX_TEMPLATE_BYTES + 1)
        if len(text) > MAX_TEMPLATE_BYTES:
            raise TemplateError(f"{path}: longer than {MAX_TEMPLATE_BYTES} bytes")
        return cls.from_json(text)

    @classmethod
    def from_json(cls, text: str | bytes) -> InjectionTemplate:
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise TemplateError(f"not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise TemplateError("expected a JSON object")
        sidecar = _field(data, "sidecar", dict)
        if sidecar.get("name") != SIDECAR_NAME:
            raise TemplateError(f"the sidecar container must be named {SIDECAR_NAME}")
        return cls(
            sidecar=sidecar,
            native=_field(data, "native", bool),
            volumes=_field(data, "volumes", list),
            model_server_env=_field(data, "modelServerEnv", list),
            model_server_mounts=_field(data, "modelServerMounts", list),
            pod_annotations=_field(data, "podAnnotations", dict),
            visible_devices=_field(data, "visibleDevices", str),
        )

    def sidecar_container(self) -> Json:
        """A fresh copy: callers adjust it per pod."""
        return copy.deepcopy(self.sidecar)

    @property
    def socket_dir(self) -> str:
        """The mount path of the socket volume in the sidecar."""
        (path,) = [
            mount["mountPath"]
            for mount in self.sidecar.get("volumeMounts", [])
            if mount.get("name") == SOCKET_VOLUME
        ]
        return str(path)

    @property
    def socket_target(self) -> str:
        """The sidecar's gRPC address as the model server dials it (unix://...)."""
        (target,) = [e["value"] for e in self.model_server_env if e.get("name") == GRPC_ENV]
        return str(target)


def _field(data: Json, key: str, kind: type) -> Any:
    value = data.get(key)
    if not isinstance(value, kind):
        raise TemplateError(f"{key}: expected a {kind.__name__}, got {type(value).__name__}")
    return value
