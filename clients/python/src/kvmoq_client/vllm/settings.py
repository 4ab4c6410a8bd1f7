"""The connector's settings: `kv_connector_extra_config` of vLLM's `--kv-transfer-config`.

These key names are the contract with operators (the README lists them); every other key
is refused, so a typo is an error at start-up rather than a default silently used.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvmoq_client.client import DEFAULT_TARGET

CONNECTOR = "KVMoqConnector"
CONNECTOR_MODULE = "kvmoq_client.vllm"
ROLES = ("kv_producer", "kv_consumer", "kv_both")
"""vLLM's `kv_role`: publish only, load only, or both."""
LOAD_FAILURE_POLICY = "recompute"
"""vLLM recomputes the blocks a load could not bring (its default, "fail", ends the
request)."""
DEFAULT_LOAD_DEADLINE_S = 5.0
DEFAULT_STAGING_TOKENS = 8192
DEFAULT_LOOKUP_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class ConnectorSettings:
    sidecar: str = DEFAULT_TARGET
    """The sidecar's gRPC target (`unix:///run/kvmoq/sidecar.sock` in a pod)."""
    model: str = ""
    """The model's name in prompt namespaces; empty: vLLM's served model name. Producers and
    consumers of one model must agree on it."""
    tracks: tuple[str, ...] = ()
    """Compressions published (and the ones loads may use, best first); empty: the
    sidecar's own setting."""
    default_track: str = ""
    """The track encoded eagerly when publishing; empty: the sidecar's."""
    max_kl: float | None = None
    """Loads' quality floor (`KVCacheClient.load`'s `max_kl`), unless a request sets its
    own (`kvmoq_max_kl`); None: the sidecar's `--max-kl`, by default the near-lossless
    tracks only."""
    load_deadline: float = DEFAULT_LOAD_DEADLINE_S
    """Seconds a load may take; chunks that cannot land in time are recomputed by vLLM."""
    lookup_timeout: float = DEFAULT_LOOKUP_TIMEOUT_S
    """Seconds a request's Lookup may take before it counts as a miss (the request waits
    for it, the scheduler does not)."""
    compute_rate: float | None = None
    """Tokens per second this engine computes a prompt at (its prefill rate), which a load's
    chunks must beat (`KVCacheClient.load`'s `compute_tokens_per_second`): where the first
    chunk would arrive later than the engine computes it, the load leaves the prompt to the
    engine. None: measured on the engine's own prefill steps where vLLM's cache is on the
    CPU, unknown on a GPU (whose forward runs apart from the steps the connector sees).
    0: never sent, every chunk that lands by the deadline loads (an engine busy with other
    requests may gain from any chunk it does not compute, however slow)."""
    staging_tokens: int = DEFAULT_STAGING_TOKENS
    """Tokens of shared memory between vLLM's cache and the sidecar (CPU: vLLM's cache is in
    its private memory); loads and publishes that do not fit wait or are skipped."""

    @classmethod
    def from_extra_config(cls, extra: Mapping[str, Any] | None) -> ConnectorSettings:
        extra = dict(extra or {})
        unknown = sorted(set(extra) - set(cls.__dataclass_fields__))
        if unknown:
            known = ", ".join(sorted(cls.__dataclass_fields__))
            raise ValueError(f"kvmoq connector: unknown keys {unknown} (known: {known})")
        tracks = extra.pop("tracks", ())
        if isinstance(tracks, str):
            tracks = [name.strip() for name in tracks.split(",") if name.strip()]
        settings = cls(**extra, tracks=tuple(tracks))
        for name in ("load_deadline", "lookup_timeout"):
            if not float(getattr(settings, name)) > 0:
                raise ValueError(f"kvmoq connector: {name} must be > 0 seconds")
        if settings.max_kl is not None and not float(settings.max_kl) > 0:
            raise ValueError("kvmoq connector: max_kl must be a KL bound > 0")
        rate = settings.compute_rate
        if rate is not None and not 0 <= float(rate) < float("inf"):
            raise ValueError("kvmoq connector: compute_rate must be tokens per second >= 0")
        if int(settings.staging_tokens) < 1:
            raise ValueError("kvmoq connector: staging_tokens must be >= 1")
        return settings


def kv_transfer_config(role: str, extra: Mapping[str, Any]) -> dict[str, Any]:
    """vLLM's `--kv-transfer-config` for this connector, checked as the connector will check
    it at start-up (`ValueError` names what is wrong)."""
    if role not in ROLES:
        raise ValueError(
            f"kvmoq connector: kv_role must be one of {', '.join(ROLES)}, got {role!r}"
        )
    ConnectorSettings.from_extra_config(extra)
    return {
        "kv_connector": CONNECTOR,
        "kv_connector_module_path": CONNECTOR_MODULE,
        "kv_role": role,
        "kv_load_failure_policy": LOAD_FAILURE_POLICY,
        "kv_connector_extra_config": dict(extra),
    }
