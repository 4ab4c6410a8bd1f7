"""A pod in, a decision out: inject the sidecar, leave the pod alone, or refuse it.

No I/O: the admission server hands in the pod of an AdmissionReview and sends back the
decision's JSONPatch. The patch is computed by `jsonpatch` as the difference between the pod
and the pod with the sidecar, so what is written here is the target pod, not patch paths.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any

import jsonpatch

from sidecar.injector.pod_options import (
    INJECT_LABEL,
    INJECTED,
    INJECTED_LABEL,
    STATUS,
    OptionError,
    PodOptions,
)
from sidecar.injector.template import (
    RELAY_ENV,
    SHM_PATH,
    SHM_VOLUME,
    SIDECAR_NAME,
    TRACKS_ENV,
    VISIBLE_DEVICES_ENV,
    InjectionTemplate,
    Json,
)

TRANSFER_CONFIG_FLAG = "--kv-transfer-config"


@dataclass(frozen=True)
class Inject:
    patch: list[Json]
    """RFC 6902 operations that turn the pod into the injected pod."""


@dataclass(frozen=True)
class Leave:
    reason: str


@dataclass(frozen=True)
class Refuse:
    message: str


Decision = Inject | Leave | Refuse


class _Refused(Exception):
    pass


def decide(pod: Any, template: InjectionTemplate) -> Decision:
    """What to do with `pod` (a Pod object as the API server sends it)."""
    if not isinstance(pod, dict) or not isinstance(pod.get("metadata", {}), dict):
        return Leave("not a pod object")
    metadata = pod.get("metadata", {})
    labels = metadata.get("labels") or {}
    if not isinstance(labels, dict) or labels.get(INJECT_LABEL) != "true":
        return Leave(f'not labelled {INJECT_LABEL}: "true"')
    try:
        injected = _injected(pod, template)
    except (_Refused, OptionError) as exc:
        return Refuse(str(exc))
    if injected is None:
        return Leave("already injected")
    return Inject(jsonpatch.make_patch(pod, injected).patch)


def _injected(pod: Json, template: InjectionTemplate) -> Json | None:
    """The pod with the sidecar, or None when it has one already."""
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        raise _Refused("the pod has no spec")
    containers = _objects(spec, "containers")
    if not containers:
        raise _Refused("the pod has no containers")
    init_containers = _objects(spec, "initContainers")
    annotations = pod["metadata"].get("annotations") or {}
    if not isinstance(annotations, dict):
        raise _Refused("metadata.annotations is not a map")
    names = {c.get("name") for c in (*containers, *init_containers)}
    if annotations.get(STATUS) == INJECTED or SIDECAR_NAME in names:
        return None
    options = PodOptions.from_annotations(annotations)

    new = copy.deepcopy(pod)
    spec = new["spec"]
    apps = _objects(spec, "containers")
    volumes = _objects(spec, "volumes")
    _check_free(apps, volumes, template)
    shm = _shared_memory_volume(apps)
    sidecar = _sidecar(template, options, apps)
    if options.cuda_ipc:
        # CUDA IPC handles open only in the exporting process's PID namespace.
        spec["shareProcessNamespace"] = True
    own_volumes = template.volumes
    if shm is not None:
        # The pod has its own /dev/shm volume (vLLM's charts mount one): share that.
        _rename_mount(sidecar, SHM_VOLUME, shm)
        own_volumes = [v for v in own_volumes if v.get("name") != SHM_VOLUME]
    for container in apps:
        _add_model_server(container, template, shm)
    if options.vllm is not None:
        _add_transfer_config(apps, options, template)
    if template.native:
        spec["initContainers"] = [sidecar, *_objects(spec, "initContainers")]
    else:
        apps.append(sidecar)
    spec["volumes"] = [*volumes, *copy.deepcopy(own_volumes)]
    metadata = new["metadata"]
    metadata["labels"] = {**(metadata.get("labels") or {}), INJECTED_LABEL: "true"}
    metadata["annotations"] = {**template.pod_annotations, **annotations, STATUS: INJECTED}
    return new


def _objects(spec: Json, key: str) -> list[Json]:
    items = spec.get(key) or []
    if not isinstance(items, list) or not all(isinstance(c, dict) for c in items):
        raise _Refused(f"spec.{key} is not a list of objects")
    return items


def _check_free(apps: list[Json], volumes: list[Json], template: InjectionTemplate) -> None:
    """The sidecar's volume names and socket directory must be the pod's to give."""
    ours = {v.get("name") for v in template.volumes}
    taken = sorted(ours & {v.get("name") for v in volumes})
    if taken:
        raise _Refused(f"the pod already has volumes named {', '.join(taken)}")
    for container in apps:
        for mount in container.get("volumeMounts") or []:
            if mount.get("mountPath") == template.socket_dir:
                raise _Refused(
                    f"container {container.get('name')} mounts {template.socket_dir}, where "
                    "the sidecar's socket goes"
                )


def _shared_memory_volume(apps: list[Json]) -> str | None:
    """The volume the pod's containers already mount at /dev/shm, if any."""
    names = {
        mount.get("name")
        for container in apps
        for mount in container.get("volumeMounts") or []
        if mount.get("mountPath") == SHM_PATH
    }
    if len(names) > 1:
        raise _Refused(f"containers mount different volumes at {SHM_PATH}: {sorted(names)}")
    return names.pop() if names else None


def _sidecar(template: InjectionTemplate, options: PodOptions, apps: list[Json]) -> Json:
    """The template's sidecar with the pod's annotations applied, in the order and shape the
    chart's named template gives the same settings (tests compare the two)."""
    sidecar = template.sidecar_container()
    if options.relay_url is not None:
        _set_env(sidecar, RELAY_ENV, options.relay_url)
    if options.tracks:
        _set_env(sidecar, TRACKS_ENV, ",".join(options.tracks))
    if options.resources is not None:
        sidecar["resources"] = {**sidecar.get("resources", {}), **options.resources}
    if options.cuda_ipc:
        # The handles open only where the sidecar sees the model server's GPU.
        claims = [claim for c in apps for claim in (c.get("resources") or {}).get("claims") or []]
        devices = options.visible_devices or template.visible_devices
        if claims:
            sidecar["resources"] = {**sidecar.get("resources", {}), "claims": claims}
        elif devices:
            _set_env(sidecar, VISIBLE_DEVICES_ENV, devices)
        else:
            raise _Refused(
                "kvmoq.io/cuda-ipc needs the sidecar to see the model server's GPU: DRA "
                "claims in the containers' resources, or kvmoq.io/visible-devices"
            )
    return sidecar


def _set_env(container: Json, name: str, value: str) -> None:
    env = container.setdefault("env", [])
    for entry in env:
        if entry.get("name") == name:
            entry.clear()
            entry.update(name=name, value=value)
            return
    env.append({"name": name, "value": value})


def _rename_mount(container: Json, old: str, new: str) -> None:
    for mount in container.get("volumeMounts", []):
        if mount.get("name") == old:
            mount["name"] = new


def _add_model_server(container: Json, template: InjectionTemplate, shm: str | None) -> None:
    """The socket's address and the shared volumes, as the chart gives its model server;
    a variable the container sets itself is left as it is."""
    env = container.get("env") or []
    have = {entry.get("name") for entry in env}
    container["env"] = [
        *(copy.deepcopy(e) for e in template.model_server_env if e["name"] not in have),
        *env,
    ]
    mounts = container.get("volumeMounts") or []
    paths = {mount.get("mountPath") for mount in mounts}
    added = []
    for mount in copy.deepcopy(template.model_server_mounts):
        if mount["mountPath"] in paths:
            continue  # its own /dev/shm, shared with the sidecar
        if mount["name"] == SHM_VOLUME and shm is not None:
            mount["name"] = shm
        added.append(mount)
    container["volumeMounts"] = [*mounts, *added]


def _add_transfer_config(
    apps: list[Json], options: PodOptions, template: InjectionTemplate
) -> None:
    assert options.vllm is not None
    name = options.vllm.container
    matches = [c for c in apps if c.get("name") == name]
    if not matches:
        raise _Refused(f"kvmoq.io/vllm-container: the pod has no container {name!r}")
    (container,) = matches
    given = [*(container.get("command") or []), *(container.get("args") or [])]
    if any(str(arg).startswith(TRANSFER_CONFIG_FLAG) for arg in given):
        raise _Refused(f"container {name} sets {TRANSFER_CONFIG_FLAG} itself")
    config = options.vllm.transfer_config(template.socket_target)
    container["args"] = [*(container.get("args") or []), TRANSFER_CONFIG_FLAG, json.dumps(config)]
