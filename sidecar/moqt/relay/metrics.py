"""The relay's Prometheus series, read from the protocol core when scraped.

``core`` counts in plain integers (``RelayCounters``) so the hot path pays an addition
and nothing else; this collector turns them, and the sizes of what the relay holds, into
series on a registry of the relay's own, served by ``kvmoq relay --http``.
"""

from __future__ import annotations

import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from ..protocol.drafts import DRAFTS
from .core import Relay


class RelayCollector(Collector):
    def __init__(self, relay: Relay) -> None:
        self._relay = relay

    def collect(self) -> Iterator[Metric]:
        relay, counters = self._relay, self._relay.counters
        for name, help_text, value in (
            ("subscribes_received", "SUBSCRIBEs taken from sessions", counters.subscribes_received),
            (
                "subscribes_sent",
                "SUBSCRIBEs sent to publishers or the upstream relay (one per track however "
                "many subscribe here)",
                counters.subscribes_sent,
            ),
            ("fetches_received", "FETCHes taken from sessions", counters.fetches_received),
            (
                "fetches_sent",
                "FETCHes sent on to publishers or the upstream relay (the cache lacked them)",
                counters.fetches_sent,
            ),
            (
                "object_bytes_received",
                "Object payload bytes received from publishers or the upstream relay",
                counters.object_bytes_received,
            ),
            (
                "object_bytes_sent",
                "Object payload bytes sent, every delivery counted",
                counters.object_bytes_sent,
            ),
            (
                "upstream_sessions",
                "Sessions opened to the upstream relay (more than one: reconnections)",
                counters.upstream_sessions,
            ),
            (
                "tracks_expired",
                "Cached tracks dropped once nobody could send them for --retention seconds",
                counters.tracks_expired,
            ),
        ):
            yield CounterMetricFamily(f"kvmoq_relay_{name}", help_text, value=value)
        for name, help_text, gauge in (
            ("sessions", "Sessions open, the upstream one included", len(relay.peers)),
            ("tracks", "Tracks the relay carries now", len(relay.tracks)),
            ("cache_bytes", "Bytes the object cache holds", relay.cache.size),
            (
                "upstream_up",
                "1 while the session to the upstream relay is open",
                relay.upstream is not None,
            ),
        ):
            yield GaugeMetricFamily(f"kvmoq_relay_{name}", help_text, value=float(gauge))
        by_draft = Counter(peer.moqt.draft.number for peer in relay.peers)
        family = GaugeMetricFamily(
            "kvmoq_relay_sessions_by_draft",
            "Sessions open per MoQT draft, the upstream one included (during an upgrade: who "
            "is still on the older draft)",
            labels=["draft"],
        )
        for number in sorted(DRAFTS):
            family.add_metric([str(number)], float(by_draft[number]))
        yield family


def scrape(address: str, timeout: float = 10.0) -> dict[str, float]:
    """A relay's ``kvmoq_relay_*`` series, read from its /metrics at ``address`` (HOST:PORT),
    by short name: ``subscribes_sent`` for ``kvmoq_relay_subscribes_sent_total``, and
    ``sessions_by_draft:16`` for the sample labelled draft="16"."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=timeout) as response:
        text = response.read().decode()
    return {
        ":".join(
            (
                sample.name.removeprefix("kvmoq_relay_").removesuffix("_total"),
                *sample.labels.values(),
            )
        ): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("kvmoq_relay_") and not sample.name.endswith("_created")
    }


def exposition(relay: Relay) -> Callable[[], bytes]:
    """What /metrics serves for ``relay``: its series alone, on a registry of its own."""
    registry = CollectorRegistry()
    registry.register(RelayCollector(relay))
    return lambda: generate_latest(registry)
