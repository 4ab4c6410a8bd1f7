"""The chart's Grafana dashboard against a running sidecar: every series a panel queries is
one the sidecar exports, of the type the query treats it as, and every panel is per pod."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from sidecar.demo.children import Children
from sidecar.demo.nodes import start_sidecar
from sidecar.moqt.aio.tls import write_certificate
from tests.helm.chart import CHART, find, needs_helm, render
from tests.support.relay import running_relay

pytestmark = needs_helm

DASHBOARD = CHART / "dashboards" / "kvmoq-sidecars.json"
SERIES = re.compile(r"\b(kvmoq_[a-z_]+)")
SUFFIXES = {"_total": "counter", "_bucket": "histogram", "_sum": "histogram", "_count": "histogram"}


def exported(metrics_text: str) -> dict[str, str]:
    """Metric family name -> type, from a Prometheus text exposition."""
    return {f.name: f.type for f in text_string_to_metric_families(metrics_text)}


def family(series: str, families: dict[str, str]) -> tuple[str, str]:
    """The family a queried series belongs to, and the type the query's suffix implies."""
    for suffix, kind in SUFFIXES.items():
        if series.endswith(suffix) and series.removesuffix(suffix) in families:
            return series.removesuffix(suffix), kind
    return series, "gauge"


def expressions(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]


def test_the_chart_ships_the_dashboard_file(tmp_path: Path) -> None:
    config_map = find(render(tmp_path, {}), "ConfigMap", "r-kvmoq-dashboard")
    assert config_map["metadata"]["labels"] == {"grafana_dashboard": "1"}
    assert json.loads(config_map["data"]["kvmoq-sidecars.json"]) == json.loads(
        DASHBOARD.read_text()
    )
    docs = render(tmp_path, {"dashboard": {"enabled": False}})
    assert not [d for d in docs if d["metadata"]["name"] == "r-kvmoq-dashboard"]


def test_every_series_the_dashboard_queries_is_exported_by_a_sidecar(tmp_path: Path) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    cert = write_certificate(tmp_path)
    with running_relay(cert) as relay, Children() as children:
        sidecar = start_sidecar(children, "sidecar", relay.url, cert.cert, tmp_path)
        status, text = sidecar.get("/metrics")
    assert status == 200
    families = exported(text)
    queried = {s for expr in expressions(dashboard) for s in SERIES.findall(expr)}
    assert len(queried) >= 7, queried
    for series in sorted(queried):
        name, kind = family(series, families)
        assert name in families, f"{series}: the sidecar exports no {name}"
        assert families[name] == kind, f"{series}: {name} is a {families[name]}, not a {kind}"
    # The relay session is up: the gauge the pod variable is built from has a sample.
    up = [s for f in text_string_to_metric_families(text) if f.name == "kvmoq_relay_up"
          for s in f.samples]  # fmt: skip
    assert [s.value for s in up] == [1.0]


def test_every_panel_is_per_pod() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    for expr in expressions(dashboard):
        assert 'pod=~"$pod"' in expr, expr
        assert re.search(r"by \([^)]*\bpod\b", expr), expr
