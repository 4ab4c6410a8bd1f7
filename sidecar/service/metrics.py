"""The sidecar's Prometheus metrics, on a registry of its own.

A registry per process object (not prometheus-client's global one) so that what /metrics
shows is exactly the sidecar's series, and tests or an embedding process can run more than
one without duplicate-name errors.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LOAD_SECONDS_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
"""From a few cached chunks on loopback to a long prompt over a slow WAN link."""


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        registry = self.registry
        self.published_bytes = Counter(
            "kvmoq_published_bytes",
            "KV bytes encoded for publication, per track",
            ["track"],
            registry=registry,
        )
        self.published_chunks = Counter(
            "kvmoq_published_chunks",
            "KV chunks encoded for publication, per track",
            ["track"],
            registry=registry,
        )
        self.loaded_bytes = Counter(
            "kvmoq_loaded_bytes",
            "KV bytes fetched, verified and written into a model server's buffers, per track",
            ["track"],
            registry=registry,
        )
        self.loaded_chunks = Counter(
            "kvmoq_loaded_chunks",
            "KV chunks fetched, verified and written, per track",
            ["track"],
            registry=registry,
        )
        self.load_seconds = Histogram(
            "kvmoq_load_seconds",
            "Duration of Load calls, by why they stopped",
            ["stop_reason"],
            buckets=LOAD_SECONDS_BUCKETS,
            registry=registry,
        )
        self.lookups = Counter(
            "kvmoq_cache_lookups",
            "Lookups and loads by result: hit (some prefix available) or miss",
            ["result"],
            registry=registry,
        )
        self.verification_failures = Counter(
            "kvmoq_verification_failures",
            "Fetched chunks rejected (digest, size or decoding) and never written",
            registry=registry,
        )
        self.catalog_refusals = Counter(
            "kvmoq_catalog_refusals",
            "Catalog revisions refused, by reason: unsigned, unknown_key or bad_signature "
            "(with --trusted-keys), malformed, wrong_prompt, contradiction",
            ["reason"],
            registry=registry,
        )
        self.evicted_prompts = Counter(
            "kvmoq_evicted_prompts",
            "Published prompts withdrawn to keep what they hold under --max-published-bytes",
            registry=registry,
        )
        self.relay_reconnects = Counter(
            "kvmoq_relay_reconnects",
            "Relay sessions opened after the first one",
            registry=registry,
        )
        self.relay_up = Gauge(
            "kvmoq_relay_up", "1 while the MoQT session to the relay is open", registry=registry
        )

    def exposition(self) -> bytes:
        """The text format /metrics serves."""
        return generate_latest(self.registry)
