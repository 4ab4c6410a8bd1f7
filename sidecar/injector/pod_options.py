"""A pod's kvmoq annotations: what it asks of the injector beyond the chart's defaults.

Every value is checked here, so a typo refuses the pod with a message that names the
annotation, instead of a sidecar that fails later in a crash loop.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kvmoq_client.vllm.settings import ROLES, kv_transfer_config

from sidecar.kvcache.errors import UnknownCodecError
from sidecar.kvcache.tracks import parse_codec_names

PREFIX = "kvmoq.io/"
INJECT_LABEL = f"{PREFIX}inject"
"""The pod label that asks for the sidecar (the webhook's objectSelector)."""
INJECTED_LABEL = f"{PREFIX}sidecar"
"""Set on every injected pod: the relay's NetworkPolicy admits pods that carry it."""
STATUS = f"{PREFIX}status"
"""Set to "injected" on every injected pod: a second pass leaves the pod alone."""
INJECTED = "injected"

RELAY_URL = f"{PREFIX}relay-url"
TRACKS = f"{PREFIX}tracks"
RESOURCES = f"{PREFIX}resources"
CUDA_IPC = f"{PREFIX}cuda-ipc"
VISIBLE_DEVICES = f"{PREFIX}visible-devices"
VLLM_CONTAINER = f"{PREFIX}vllm-container"
VLLM_ROLE = f"{PREFIX}vllm-role"
VLLM_CONFIG = f"{PREFIX}vllm-config"
KNOWN = (
    RELAY_URL, TRACKS, RESOURCES, CUDA_IPC, VISIBLE_DEVICES, VLLM_CONTAINER, VLLM_ROLE,
    VLLM_CONFIG, STATUS,
)  # fmt: skip
RESOURCE_KEYS = ("requests", "limits", "claims")
MAX_ANNOTATION_BYTES = 4096


class OptionError(ValueError):
    """An annotation the injector cannot honour; the message names it."""


@dataclass(frozen=True)
class VllmOptions:
    container: str
    """The vLLM container, which gets `--kv-transfer-config`."""
    role: str
    extra_config: dict[str, Any]
    """`kv_connector_extra_config` beyond the sidecar's socket."""

    def transfer_config(self, socket: str) -> dict[str, Any]:
        return kv_transfer_config(self.role, {"sidecar": socket, **self.extra_config})


@dataclass(frozen=True)
class PodOptions:
    relay_url: str | None = None
    tracks: tuple[str, ...] = ()
    resources: dict[str, Any] | None = None
    cuda_ipc: bool = False
    visible_devices: str | None = None
    vllm: VllmOptions | None = None

    @classmethod
    def from_annotations(cls, annotations: dict[str, str]) -> PodOptions:
        ours = {key: value for key, value in annotations.items() if key.startswith(PREFIX)}
        unknown = sorted(set(ours) - set(KNOWN))
        if unknown:
            raise OptionError(
                f"unknown annotation {', '.join(unknown)} (known: {', '.join(KNOWN)})"
            )
        for key, value in ours.items():
            if not isinstance(value, str) or len(value) > MAX_ANNOTATION_BYTES:
                raise OptionError(f"{key}: expected a string of at most {MAX_ANNOTATION_BYTES}")
        return cls(
            relay_url=_relay_url(ours[RELAY_URL]) if RELAY_URL in ours else None,
            tracks=_tracks(ours[TRACKS]) if TRACKS in ours else (),
            resources=_resources(ours[RESOURCES]) if RESOURCES in ours else None,
            cuda_ipc=_flag(CUDA_IPC, ours.get(CUDA_IPC, "false")),
            visible_devices=ours.get(VISIBLE_DEVICES),
            vllm=_vllm(ours),
        )


def _relay_url(text: str) -> str:
    from sidecar.moqt.aio.transport import MoqtConnectError, MoqtUrl

    try:
        MoqtUrl.parse(text)
    except MoqtConnectError as exc:
        raise OptionError(f"{RELAY_URL}: {exc}") from None
    return text


def _tracks(text: str) -> tuple[str, ...]:
    try:
        return parse_codec_names(text)
    except UnknownCodecError as exc:
        raise OptionError(f"{TRACKS}: {exc}") from None


def _json_object(key: str, text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise OptionError(f"{key}: not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise OptionError(f"{key}: expected a JSON object")
    return value


def _resources(text: str) -> dict[str, Any]:
    value = _json_object(RESOURCES, text)
    unknown = sorted(set(value) - set(RESOURCE_KEYS))
    if unknown:
        raise OptionError(f"{RESOURCES}: unknown keys {unknown} (known: {list(RESOURCE_KEYS)})")
    return value


def _flag(key: str, text: str) -> bool:
    if text not in ("true", "false"):
        raise OptionError(f'{key}: expected "true" or "false", got {text!r}')
    return text == "true"


def _vllm(ours: dict[str, str]) -> VllmOptions | None:
    container = ours.get(VLLM_CONTAINER)
    if container is None:
        stray = [key for key in (VLLM_ROLE, VLLM_CONFIG) if key in ours]
        if stray:
            raise OptionError(f"{', '.join(stray)} without {VLLM_CONTAINER}: which container?")
        return None
    role = ours.get(VLLM_ROLE, "kv_both")
    if role not in ROLES:
        raise OptionError(f"{VLLM_ROLE}: expected one of {', '.join(ROLES)}, got {role!r}")
    extra = _json_object(VLLM_CONFIG, ours[VLLM_CONFIG]) if VLLM_CONFIG in ours else {}
    if "sidecar" in extra:
        raise OptionError(f"{VLLM_CONFIG}: 'sidecar' is the injected sidecar's socket")
    options = VllmOptions(container, role, extra)
    try:
        options.transfer_config("unix:///check")
    except (TypeError, ValueError) as exc:
        raise OptionError(f"{VLLM_CONFIG}: {exc}") from None
    return options
