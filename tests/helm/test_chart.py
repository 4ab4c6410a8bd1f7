"""The Helm chart (helm/kvmoq), rendered by a real helm and checked as parsed manifests."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from sidecar.injector.pod_options import INJECTED_LABEL
from sidecar.service.config import OPTIONS
from tests.helm.chart import (
    CHART,
    EDGES,
    INFERENCE,
    KUBERNETES_VERSIONS,
    MODEL,
    ROOT,
    VALIDATE,
    container,
    env,
    find,
    helm,
    merged,
    mounts,
    needs_helm,
    pod,
    render,
    render_error,
    render_text,
    validate,
    values_file,
)

pytestmark = needs_helm

SIDECAR_LABEL = {INJECTED_LABEL: "true"}


@pytest.mark.parametrize(
    "values",
    [
        {},
        INFERENCE,
        merged(INFERENCE, {"sidecar": {"native": False, "probes": "grpc"}}),
        merged(
            INFERENCE,
            {
                "relay": {"enabled": False},
                "sidecar": {"relayURL": "moqt://relay.kv:4443"},
                "inference": {"cudaIPC": {"enabled": True, "sidecarVisibleDevices": "all"}},
            },
        ),
    ],
    ids=["defaults", "inference", "plain-container-grpc-probes", "external-relay-cuda-ipc"],
)
def test_lint_passes(tmp_path: Path, values: dict[str, Any]) -> None:
    result = helm("lint", "--strict", CHART, "-f", values_file(tmp_path, values))
    assert result.returncode == 0, result.stdout + result.stderr


def test_defaults_render_the_relay_and_the_injector(tmp_path: Path) -> None:
    docs = render(tmp_path, {})
    assert sorted((d["kind"], d["metadata"]["name"]) for d in docs) == [
        ("ConfigMap", "r-kvmoq-dashboard"),
        ("ConfigMap", "r-kvmoq-injection"),
        ("Deployment", "r-kvmoq-injector"),
        ("Deployment", "r-relay"),
        ("MutatingWebhookConfiguration", "r-kvmoq-injector"),
        ("PodDisruptionBudget", "r-kvmoq-injector"),
        ("PodDisruptionBudget", "r-relay"),
        ("Secret", "r-kvmoq-injector-tls"),
        ("Service", "r-kvmoq-injector"),
        ("Service", "r-relay"),
    ]


def relay_args(workload: dict[str, Any]) -> list[str]:
    return container(workload["spec"]["template"]["spec"], "relay")["args"]


def test_a_relay_cluster_puts_an_edge_on_every_node_under_the_root(tmp_path: Path) -> None:
    docs = render(tmp_path, merged(INFERENCE, EDGES))
    root = find(docs, "Deployment", "r-relay")
    edge = find(docs, "DaemonSet", "r-relay-edge")
    assert "--http=0.0.0.0:9465" in relay_args(root)
    assert not [a for a in relay_args(root) if a.startswith("--upstream")]
    assert relay_args(edge)[-3:] == [
        "--upstream=moqt://r-relay:4443",
        "--ca=/tls/ca.crt",
        "--upstream-timeout=10",
    ]
    # The tiers differ only in their upstream and labels: one pod spec definition.
    root_spec, edge_spec = (w["spec"]["template"]["spec"] for w in (root, edge))
    assert relay_args(root) == relay_args(edge)[:-3]
    assert {**container(root_spec, "relay"), "args": []} == {
        **container(edge_spec, "relay"),
        "args": [],
    }
    probe = container(edge_spec, "relay")["readinessProbe"]
    assert probe == {"httpGet": {"path": "/readyz", "port": "metrics"}}
    # Each tier's Service selects its own pods; sidecars reach the edge on their node.
    root_service, edge_service = (
        find(docs, "Service", "r-relay"),
        find(docs, "Service", "r-relay-edge"),
    )
    assert root_service["spec"]["selector"] == root["spec"]["selector"]["matchLabels"]
    assert edge_service["spec"]["selector"] == edge["spec"]["selector"]["matchLabels"]
    assert root_service["spec"]["selector"] != edge_service["spec"]["selector"]
    assert edge_service["spec"]["internalTrafficPolicy"] == "Local"
    sidecar = container(pod(docs)["spec"], "kvmoq-sidecar", "initContainers")
    assert env(sidecar)["KVMOQ_RELAY"] == "moqt://r-relay-edge.default.svc:4443"
    validate(tmp_path, render_text(tmp_path, merged(INFERENCE, EDGES)))

    # Edges as a Deployment: as many as asked, behind a Service that spreads sidecars.
    values = merged(EDGES, {"relay": {"edges": {"kind": "Deployment", "replicas": 3}}})
    docs = render(tmp_path, values)
    assert find(docs, "Deployment", "r-relay-edge")["spec"]["replicas"] == 3
    assert "internalTrafficPolicy" not in find(docs, "Service", "r-relay-edge")["spec"]
    result = helm("lint", "--strict", CHART, "-f", values_file(tmp_path, values))
    assert result.returncode == 0, result.stdout + result.stderr


def test_relays_run_from_the_relay_image_on_the_fastest_stack_it_has(tmp_path: Path) -> None:
    docs = render(tmp_path, EDGES)
    for workload in (find(docs, "Deployment", "r-relay"), find(docs, "DaemonSet", "r-relay-edge")):
        relay = container(workload["spec"]["template"]["spec"], "relay")
        assert relay["image"] == "kvmoq-relay:0.1.0"  # same tag as the kvmoq image
        assert not [a for a in relay_args(workload) if a.startswith("--backend")]  # auto
    named = render(tmp_path, {"relay": {"backend": "qh3"}})
    assert "--backend=qh3" in relay_args(find(named, "Deployment", "r-relay"))


def test_inference_pod_gets_a_native_sidecar_beside_the_model_server(tmp_path: Path) -> None:
    spec = pod(render(tmp_path, INFERENCE))["spec"]
    sidecar = container(spec, "kvmoq-sidecar", "initContainers")
    model = container(spec, "vllm")
    assert [c["name"] for c in spec["containers"]] == ["vllm"]

    assert sidecar["restartPolicy"] == "Always"
    assert sidecar["image"] == "kvmoq:0.1.0"
    assert sidecar["command"] == ["kvmoq", "sidecar"]
    assert env(sidecar) == {
        "KVMOQ_RELAY": "moqt://r-relay.default.svc:4443",
        "KVMOQ_CA": "/etc/kvmoq/ca/ca.crt",
        "KVMOQ_GRPC": "unix:///run/kvmoq/sidecar.sock",
        # The gRPC port serves the whole API unauthenticated: loopback unless probes use it.
        "KVMOQ_PROBE": "127.0.0.1:7070",
        "KVMOQ_HTTP": "0.0.0.0:9464",
        "KVMOQ_SHM_ROOTS": "/dev/shm",
        "KVMOQ_LOG_FORMAT": "json",
    }
    assert {p["name"]: p["containerPort"] for p in sidecar["ports"]} == {
        "kvmoq-grpc": 7070,
        "kvmoq-metrics": 9464,
    }
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert sidecar[probe]["httpGet"] == {"path": "/healthz", "port": 9464}, probe
    assert mounts(sidecar) == {
        "/run/kvmoq": "kvmoq-socket",
        "/dev/shm": "kvmoq-shm",
        "/etc/kvmoq/ca": "kvmoq-ca",
    }

    # The model server keeps its own spec and gets the socket, /dev/shm and its address.
    assert model["image"] == MODEL["image"] and model["args"] == MODEL["args"]
    assert model["resources"] == MODEL["resources"]
    assert env(model) == {"KVMOQ_GRPC": "unix:///run/kvmoq/sidecar.sock", "HF_HOME": "/models"}
    assert mounts(model) == {
        "/models": "models",
        "/run/kvmoq": "kvmoq-socket",
        "/dev/shm": "kvmoq-shm",
    }
    assert "kvmoq-ca" not in mounts(model).values()

    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["kvmoq-socket"] == {"name": "kvmoq-socket", "emptyDir": {}}
    assert volumes["kvmoq-shm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}
    # Only the CA key of the relay's TLS Secret is mounted, never its private key.
    assert volumes["kvmoq-ca"]["secret"] == {
        "secretName": "kvmoq-relay-tls",
        "items": [{"key": "ca.crt", "path": "ca.crt"}],
    }
    assert "models" in volumes
    assert "shareProcessNamespace" not in spec


def test_grpc_probes_and_readiness_on_the_relay_session(tmp_path: Path) -> None:
    values = merged(INFERENCE, {"sidecar": {"probes": "grpc", "readinessRequiresRelay": True}})
    sidecar = container(pod(render(tmp_path, values))["spec"], "kvmoq-sidecar", "initContainers")
    assert env(sidecar)["KVMOQ_PROBE"] == "0.0.0.0:7070"
    # "" is the process (liveness); kvmoq.v1.KVCacheService is SERVING while the relay is up.
    assert sidecar["startupProbe"]["grpc"] == {"port": 7070}
    assert sidecar["livenessProbe"]["grpc"] == {"port": 7070}
    assert sidecar["readinessProbe"]["grpc"] == {
        "port": 7070,
        "service": "kvmoq.v1.KVCacheService",
    }

    values = merged(INFERENCE, {"sidecar": {"readinessRequiresRelay": True}})
    sidecar = container(pod(render(tmp_path, values))["spec"], "kvmoq-sidecar", "initContainers")
    assert sidecar["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": 9464}
    assert sidecar["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": 9464}


def test_plain_container_sidecar_for_clusters_without_native_sidecars(tmp_path: Path) -> None:
    spec = pod(render(tmp_path, merged(INFERENCE, {"sidecar": {"native": False}})))["spec"]
    assert "initContainers" not in spec
    assert [c["name"] for c in spec["containers"]] == ["vllm", "kvmoq-sidecar"]
    assert "restartPolicy" not in container(spec, "kvmoq-sidecar")


def test_model_server_init_containers_follow_the_sidecar(tmp_path: Path) -> None:
    init = [{"name": "fetch-weights", "image": "busybox", "command": ["true"]}]
    spec = pod(render(tmp_path, merged(INFERENCE, {"inference": {"initContainers": init}})))
    assert [c["name"] for c in spec["spec"]["initContainers"]] == ["kvmoq-sidecar", "fetch-weights"]


def test_external_relay_and_ca(tmp_path: Path) -> None:
    values = merged(
        INFERENCE,
        {
            "relay": {"enabled": False},
            "sidecar": {
                "relayURL": "moqt://relay.kv.svc:4443",
                "ca": {"secret": "kv-ca", "key": "tls.crt"},
            },
        },
    )
    docs = render(tmp_path, values)
    assert not [d for d in docs if d["metadata"]["name"].startswith("r-relay")]
    spec = pod(docs)["spec"]
    sidecar = container(spec, "kvmoq-sidecar", "initContainers")
    assert env(sidecar)["KVMOQ_RELAY"] == "moqt://relay.kv.svc:4443"
    assert env(sidecar)["KVMOQ_CA"] == "/etc/kvmoq/ca/tls.crt"
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["kvmoq-ca"]["secret"] == {
        "secretName": "kv-ca",
        "items": [{"key": "tls.crt", "path": "tls.crt"}],
    }

    # No relay here and no CA Secret: the system trust store, no CA volume.
    values = merged(INFERENCE, {"relay": {"enabled": False}, "sidecar": {"relayURL": "moqt://r:1"}})
    spec = pod(render(tmp_path, values))["spec"]
    assert "KVMOQ_CA" not in env(container(spec, "kvmoq-sidecar", "initContainers"))
    assert "kvmoq-ca" not in {v["name"] for v in spec["volumes"]}


@pytest.mark.parametrize(
    ("value", "volume", "variable"),
    [
        ("token", "token", "KVMOQ_TOKEN_FILE"),
        ("promptKey", "prompt-key", "KVMOQ_PROMPT_KEY_FILE"),
        ("catalogKey", "catalog-key", "KVMOQ_CATALOG_KEY_FILE"),
        ("trustedKeys", "trusted-keys", "KVMOQ_TRUSTED_KEYS_FILE"),
    ],
)
def test_secrets_become_files_the_sidecar_reads(
    tmp_path: Path, value: str, volume: str, variable: str
) -> None:
    values = merged(INFERENCE, {"sidecar": {value: {"secret": "kv-secret", "key": "k"}}})
    spec = pod(render(tmp_path, values))["spec"]
    sidecar = container(spec, "kvmoq-sidecar", "initContainers")
    assert env(sidecar)[variable] == f"/etc/kvmoq/{volume}/k"
    mounts = {m["name"]: m for m in sidecar["volumeMounts"]}
    assert mounts[f"kvmoq-{volume}"] == {
        "name": f"kvmoq-{volume}",
        "mountPath": f"/etc/kvmoq/{volume}",
        "readOnly": True,
    }
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes[f"kvmoq-{volume}"]["secret"] == {
        "secretName": "kv-secret",
        "items": [{"key": "k", "path": "k"}],
    }
    spec = pod(render(tmp_path, INFERENCE))["spec"]  # no Secret: no file, no volume
    assert variable not in env(container(spec, "kvmoq-sidecar", "initContainers"))
    assert f"kvmoq-{volume}" not in {v["name"] for v in spec["volumes"]}


def test_settings_become_kvmoq_env(tmp_path: Path) -> None:
    settings = {
        "chunk_size": 256,
        "tracks": ["int8", "ac"],
        "max_published_bytes": 8 << 30,
        "load_seconds": 2.5,
        "drain_seconds": 20,
        "max_kl": 0.01,
    }
    values = merged(
        INFERENCE,
        {"sidecar": {"settings": settings}, "inference": {"terminationGracePeriodSeconds": 45}},
    )
    sidecar = container(pod(render(tmp_path, values))["spec"], "kvmoq-sidecar", "initContainers")
    assert {
        k: v
        for k, v in env(sidecar).items()
        if k
        not in {
            "KVMOQ_RELAY",
            "KVMOQ_CA",
            "KVMOQ_GRPC",
            "KVMOQ_PROBE",
            "KVMOQ_HTTP",
            "KVMOQ_SHM_ROOTS",
            "KVMOQ_LOG_FORMAT",
        }
    } == {
        "KVMOQ_CHUNK_SIZE": "256",
        "KVMOQ_TRACKS": "int8,ac",
        # Whole numbers stay whole: helm reads YAML numbers as floats.
        "KVMOQ_MAX_PUBLISHED_BYTES": "8589934592",
        "KVMOQ_LOAD_SECONDS": "2.5",
        "KVMOQ_DRAIN_SECONDS": "20",
        "KVMOQ_MAX_KL": "0.01",
    }


def test_schema_knows_every_sidecar_setting() -> None:
    """The chart's settings are the sidecar's options less those the chart sets itself."""
    import json

    schema = json.loads((CHART / "values.schema.json").read_text())
    settings = schema["properties"]["sidecar"]["properties"]["settings"]["properties"]
    chart_owned = {"relay", "ca", "token", "prompt_key", "catalog_key", "trusted_keys"}
    chart_owned |= {"grpc", "probe", "http", "shm_roots"}
    assert set(settings) | chart_owned == {option.name for option in OPTIONS}
    assert not set(settings) & chart_owned


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"inference": {"enabled": True}}, "inference.container.image is required"),
        ({"relay": {"backend": "aiopquic", "maxDatagramSize": 16384}}, "/relay/maxDatagramSize"),
        ({"relay": {"backend": "picoquic"}}, "/relay/backend"),
        (
            merged(INFERENCE, {"relay": {"enabled": False}}),
            "sidecar.relayURL is required when relay.enabled is false",
        ),
        (merged(INFERENCE, {"sidecar": {"relayURL": "relay:4443"}}), "/sidecar/relayURL"),
        (merged(INFERENCE, {"sidecar": {"probes": "tcp"}}), "/sidecar/probes"),
        (
            merged(INFERENCE, {"sidecar": {"settings": {"chunk_sise": 64}}}),
            "'chunk_sise' not allowed",
        ),
        (merged(INFERENCE, {"sidecar": {"settings": {"grpc": "unix:///x"}}}), "'grpc' not allowed"),
        (
            merged(INFERENCE, {"sidecar": {"settings": {"drain_seconds": 30}}}),
            "inference.terminationGracePeriodSeconds (30) must exceed the sidecar's drain_seconds (30)",
        ),
        (
            merged(INFERENCE, {"inference": {"podSpec": {"containers": []}}}),
            "inference.podSpec.containers is set by the chart",
        ),
        (
            merged(
                INFERENCE,
                {
                    "inference": {
                        "container": {"volumeMounts": [{"name": "s", "mountPath": "/dev/shm"}]}
                    }
                },
            ),
            "must not mount /dev/shm",
        ),
        (
            merged(INFERENCE, {"inference": {"container": {"name": "kvmoq-sidecar"}}}),
            "must not be kvmoq-sidecar",
        ),
        (
            merged(INFERENCE, {"inference": {"cudaIPC": {"enabled": True}}}),
            "inference.cudaIPC needs the sidecar to see the model server's GPU",
        ),
        (
            merged(INFERENCE, {"inference": {"service": {"enabled": True}}}),
            "inference.service.ports is required",
        ),
        (merged(EDGES, {"relay": {"replicas": 2}}), "relay.replicas must be 1"),
        ({"relay": {"replicas": 3}}, "scale out with relay.edges"),
        (merged(EDGES, {"relay": {"edges": {"kind": "StatefulSet"}}}), "kind"),
        ({"relay": {"certManager": {"enabled": True}}}, "relay.certManager.issuerRef.name"),
        ({"injector": {"failurePolicy": "Sometimes"}}, "failurePolicy"),
        ({"injector": {"timeoutSeconds": 60}}, "timeoutSeconds"),
        ({"injector": {"replica": 3}}, "replica"),
        ({"injectr": {"enabled": False}}, "at '': additional properties 'injectr' not allowed"),
        ({"image": {"tg": "1"}}, "at '/image': additional properties 'tg' not allowed"),
        ({"relayImage": {"tag": "1"}}, "at '/relayImage': additional properties 'tag' not allowed"),
        ({"relay": {"replica": 3}}, "at '/relay': additional properties 'replica' not allowed"),
        (
            {"relay": {"edges": {"enable": True}}},
            "at '/relay/edges': additional properties 'enable' not allowed",
        ),
        (
            {"sidecar": {"relayUrl": "moqt://relay:4443"}},
            "at '/sidecar': additional properties 'relayUrl' not allowed",
        ),
        (
            {"sidecar": {"token": {"secrte": "kvmoq-token"}}},
            "at '/sidecar/token': additional properties 'secrte' not allowed",
        ),
        (
            {"sidecar": {"metrics": {"serviceMonitor": {"label": {}}}}},
            "at '/sidecar/metrics/serviceMonitor': additional properties 'label' not allowed",
        ),
        (
            merged(INFERENCE, {"inference": {"replica": 2}}),
            "at '/inference': additional properties 'replica' not allowed",
        ),
        (
            merged(INFERENCE, {"inference": {"cudaIPC": {"enable": True}}}),
            "at '/inference/cudaIPC': additional properties 'enable' not allowed",
        ),
    ],
    ids=[
        "no-image",
        "aiopquic-jumbo-packets",
        "unknown-backend",
        "no-relay",
        "relay-url-scheme",
        "probes-kind",
        "unknown-setting",
        "chart-owned-setting",
        "grace-vs-drain",
        "pod-containers",
        "shm-mount",
        "container-name",
        "cuda-ipc-without-gpu",
        "service-without-ports",
        "replicated-root",
        "replicated-relay",
        "edge-kind",
        "relay-issuer",
        "injector-failure-policy",
        "injector-timeout",
        "injector-typo",
        "top-level-typo",
        "image-typo",
        "relay-image-typo",
        "relay-typo",
        "edges-typo",
        "sidecar-typo",
        "sidecar-token-typo",
        "sidecar-service-monitor-typo",
        "inference-typo",
        "cuda-ipc-typo",
    ],
)
def test_invalid_values_fail_with_a_clear_message(
    tmp_path: Path, values: dict[str, Any], message: str
) -> None:
    assert message in render_error(tmp_path, values)


def test_every_typo_is_named_at_once(tmp_path: Path) -> None:
    """Misspelt keys anywhere fail the render, each named with where it is."""
    error = render_error(
        tmp_path,
        {"sidecar": {"relayUrl": "x"}, "relay": {"replica": 3}, "injectr": {"enabled": False}},
    )
    assert "at '/sidecar': additional properties 'relayUrl' not allowed" in error
    assert "at '/relay': additional properties 'replica' not allowed" in error
    assert "at '': additional properties 'injectr' not allowed" in error


OPEN_VALUES = {
    "relay.resources",
    "relay.serviceMonitor.labels",
    "relay.edges.nodeSelector",
    "relay.edges.resources",
    "sidecar.resources",
    "sidecar.securityContext",
    "sidecar.metrics.serviceMonitor.labels",
    "inference.container",
    "inference.podLabels",
    "inference.podAnnotations",
    "inference.podSpec",
    "injector.namespaceSelector",
    "injector.resources",
    "dashboard.labels",
}
"""Values passed through to Kubernetes objects verbatim: any keys."""


def test_schema_declares_every_value_and_refuses_unknown_keys() -> None:
    """Every key of values.yaml is in the schema, and every object of the chart's own
    refuses keys it does not declare (a typo fails instead of being ignored), but the
    Kubernetes objects passed through verbatim."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())

    def check(path: str, values: dict[str, Any], node: dict[str, Any]) -> None:
        if path in OPEN_VALUES:
            assert node.get("additionalProperties") is not False, path
            return
        assert node.get("additionalProperties") is False, f"{path or 'top level'} is open"
        for key, value in values.items():
            name = f"{path}.{key}" if path else key
            assert key in node.get("properties", {}), f"{name} is not in values.schema.json"
            if isinstance(value, dict):
                check(name, value, node["properties"][key])

    check("", defaults, schema)


def test_cuda_ipc_shares_pid_namespace_and_gpu_claims(tmp_path: Path) -> None:
    claims = [{"name": "gpu"}]
    model = {**MODEL, "resources": {"claims": claims}}
    values = merged(
        INFERENCE,
        {
            "inference": {
                "container": model,
                "cudaIPC": {"enabled": True},
                "podSpec": {
                    "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
                },
            }
        },
    )
    spec = pod(render(tmp_path, values))["spec"]
    assert spec["shareProcessNamespace"] is True
    assert spec["resourceClaims"] == [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
    sidecar = container(spec, "kvmoq-sidecar", "initContainers")
    assert sidecar["resources"]["claims"] == claims
    assert "NVIDIA_VISIBLE_DEVICES" not in env(sidecar)
    # The pod's own IPC namespace is shared by its containers; the host's is not needed.
    assert "hostIPC" not in spec and "hostPID" not in spec

    values = merged(
        INFERENCE, {"inference": {"cudaIPC": {"enabled": True, "sidecarVisibleDevices": "all"}}}
    )
    spec = pod(render(tmp_path, values))["spec"]
    sidecar = container(spec, "kvmoq-sidecar", "initContainers")
    assert env(sidecar)["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert "claims" not in sidecar["resources"]
    assert spec["shareProcessNamespace"] is True


def test_metrics_service_annotations_and_service_monitor(tmp_path: Path) -> None:
    docs = render(
        tmp_path,
        merged(
            INFERENCE,
            {
                "sidecar": {
                    "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}}
                }
            },
        ),
    )
    template = pod(docs)
    assert template["metadata"]["annotations"] == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "9464",
        "prometheus.io/path": "/metrics",
    }
    service = find(docs, "Service", "r-inference-metrics")
    assert service["spec"]["selector"].items() <= template["metadata"]["labels"].items()
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 9464, "targetPort": 9464, "protocol": "TCP"}
    ]
    monitor = find(docs, "ServiceMonitor", "r-inference")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "30s"}
    ]

    docs = render(
        tmp_path,
        merged(
            INFERENCE,
            {
                "sidecar": {"metrics": {"service": False, "podAnnotations": False}},
                "injector": {"enabled": False},
            },
        ),
    )
    assert {d["kind"] for d in docs} == {
        "ConfigMap",  # the dashboard
        "Deployment",
        "Service",
        "PodDisruptionBudget",
    }
    assert "annotations" not in pod(docs)["metadata"]
    assert not [d for d in docs if d["metadata"]["name"] == "r-inference-metrics"]


def test_inference_service(tmp_path: Path) -> None:
    ports = [{"name": "http", "port": 8000, "targetPort": "http"}]
    docs = render(
        tmp_path, merged(INFERENCE, {"inference": {"service": {"enabled": True, "ports": ports}}})
    )
    service = find(docs, "Service", "r-inference")
    assert service["spec"]["ports"] == ports
    assert service["spec"]["selector"].items() <= pod(docs)["metadata"]["labels"].items()


@pytest.mark.skipif(not VALIDATE.exists(), reason="no .tools/venv/bin/kubernetes-validate")
def test_rendered_manifests_match_kubernetes_schemas(tmp_path: Path) -> None:
    broken = "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec:\n  containers: [{name: a, image: b, imagePullPolicey: Always}]\n"
    with pytest.raises(AssertionError, match="imagePullPolicey"):
        validate(tmp_path, broken)  # the validator does reject unknown fields

    for values in (
        merged(INFERENCE, {"sidecar": {"probes": "grpc", "readinessRequiresRelay": True}}),
        merged(
            INFERENCE,
            {
                "sidecar": {"native": False},
                "inference": {
                    "cudaIPC": {"enabled": True, "sidecarVisibleDevices": "all"},
                    "service": {"enabled": True, "ports": [{"name": "http", "port": 8000}]},
                },
            },
        ),
    ):
        validate(tmp_path, render_text(tmp_path, values))


def test_another_chart_injects_the_sidecar_with_the_named_templates(tmp_path: Path) -> None:
    parent = tmp_path / "serving"
    (parent / "templates").mkdir(parents=True)
    shutil.copytree(CHART, parent / "charts" / "kvmoq")
    (parent / "Chart.yaml").write_text(
        "apiVersion: v2\nname: serving\nversion: 1.0.0\n"
        "dependencies:\n  - {name: kvmoq, version: 0.2.0}\n"
    )
    (parent / "values.yaml").write_text(
        yaml.safe_dump(
            {
                "kvmoq": {
                    "relay": {"enabled": False},
                    "injector": {"enabled": False},
                    "dashboard": {"enabled": False},
                    "sidecar": {"relayURL": "moqt://relay.kv:4443", "settings": {"chunk_size": 64}},
                }
            }
        )
    )
    (parent / "templates" / "server.yaml").write_text(
        """\
{{- $kvmoq := dict "Values" .Values.kvmoq "Release" .Release }}
apiVersion: v1
kind: Pod
metadata:
  name: server
spec:
  initContainers:
    {{- include "kvmoq.sidecarContainer" $kvmoq | nindent 4 }}
  containers:
    - name: server
      image: server:1
      env:
        {{- include "kvmoq.modelServerEnv" $kvmoq | nindent 8 }}
      volumeMounts:
        {{- include "kvmoq.modelServerMounts" $kvmoq | nindent 8 }}
  volumes:
    {{- include "kvmoq.sidecarVolumes" $kvmoq | nindent 4 }}
"""
    )
    text = render_text(tmp_path, {}, parent)
    docs = [d for d in yaml.safe_load_all(text) if d]
    assert [(d["kind"], d["metadata"]["name"]) for d in docs] == [("Pod", "server")]
    spec = docs[0]["spec"]
    sidecar = container(spec, "kvmoq-sidecar", "initContainers")
    # The parent's overrides, over the subchart's defaults.
    assert env(sidecar)["KVMOQ_RELAY"] == "moqt://relay.kv:4443"
    assert env(sidecar)["KVMOQ_CHUNK_SIZE"] == "64"
    assert sidecar["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": 9464}
    server = container(spec, "server")
    assert env(server) == {"KVMOQ_GRPC": env(sidecar)["KVMOQ_GRPC"]}
    assert mounts(server) == {"/run/kvmoq": "kvmoq-socket", "/dev/shm": "kvmoq-shm"}
    assert {v["name"] for v in spec["volumes"]} == {"kvmoq-socket", "kvmoq-shm"}
    if VALIDATE.exists():
        validate(tmp_path, text)


def test_the_operations_doc_example_renders_and_validates(tmp_path: Path) -> None:
    doc = (ROOT / "docs" / "operations.md").read_text()
    start = doc.index("```yaml\nrelay: {enabled: false}") + len("```yaml\n")
    values = yaml.safe_load(doc[start : doc.index("```", start)])
    text = render_text(tmp_path, values)
    docs = [d for d in yaml.safe_load_all(text) if d]
    spec = pod(docs)["spec"]
    assert spec["shareProcessNamespace"] is True
    assert env(container(spec, "kvmoq-sidecar", "initContainers"))["KVMOQ_RELAY"] == (
        "moqt://kvmoq-relay.kv.svc:4443"
    )
    if VALIDATE.exists():
        validate(tmp_path, text)


def test_relay_budget_network_policy_certificate_and_service_monitor(tmp_path: Path) -> None:
    values = merged(
        INFERENCE,
        EDGES,
        {
            "relay": {
                "networkPolicy": {
                    "enabled": True,
                    "metricsFrom": [{"namespaceSelector": {"matchLabels": {"name": "mon"}}}],
                },
                "serviceMonitor": {"enabled": True, "labels": {"release": "prom"}},
                "certManager": {"enabled": True, "issuerRef": {"name": "cluster-ca"}},
            }
        },
    )
    docs = render(tmp_path, values)
    for tier, name in (("root", "r-relay"), ("edge", "r-relay-edge")):
        budget = find(docs, "PodDisruptionBudget", name)
        service = find(docs, "Service", name)
        assert budget["spec"]["maxUnavailable"] == 1
        assert budget["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
        assert service["spec"]["selector"]["app.kubernetes.io/component"] == tier
        assert {p["name"]: p["protocol"] for p in service["spec"]["ports"]} == {
            "moqt": "UDP",
            "metrics": "TCP",
        }
        monitor = find(docs, "ServiceMonitor", name)
        assert (
            monitor["spec"]["selector"]["matchLabels"].items()
            <= service["metadata"]["labels"].items()
        )
        assert monitor["metadata"]["labels"]["release"] == "prom"
        moqt, metrics = find(docs, "NetworkPolicy", name)["spec"]["ingress"]
        assert moqt["ports"] == [{"port": 4443, "protocol": "UDP"}]
        assert metrics["from"] == [{"namespaceSelector": {"matchLabels": {"name": "mon"}}}]
        sidecars = {"namespaceSelector": {}, "podSelector": {"matchLabels": SIDECAR_LABEL}}
        assert moqt["from"][0] == sidecars
    # Only the root admits the edges.
    (_, edges) = find(docs, "NetworkPolicy", "r-relay")["spec"]["ingress"][0]["from"]
    assert edges["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "edge"
    assert len(find(docs, "NetworkPolicy", "r-relay-edge")["spec"]["ingress"][0]["from"]) == 1
    # The policy admits what the injector and the chart's inference pods carry.
    assert SIDECAR_LABEL.items() <= pod(docs)["metadata"]["labels"].items()
    certificate = find(docs, "Certificate", "r-relay")["spec"]
    assert certificate["secretName"] == "kvmoq-relay-tls"
    assert {"r-relay", "r-relay-edge", "r-relay.default.svc"} <= set(certificate["dnsNames"])
    assert certificate["issuerRef"]["name"] == "cluster-ca"
    # Everything but the CRD kinds (Certificate, ServiceMonitor) against Kubernetes' schemas.
    core = [d for d in docs if d["kind"] not in ("Certificate", "ServiceMonitor")]
    validate(tmp_path, yaml.safe_dump_all(core))


CRD_KINDS = ("Certificate", "Issuer", "ServiceMonitor")
"""Kinds of cert-manager and prometheus-operator: not in Kubernetes' own schemas."""


@pytest.mark.parametrize(
    "values",
    [
        {},
        merged(
            INFERENCE,
            {"relay": {"enabled": False}, "sidecar": {"relayURL": "moqt://relay.kv:4443"}},
        ),
        merged(
            INFERENCE,
            {
                "injector": {"certManager": {"enabled": True}},
                "relay": {"certManager": {"enabled": True, "issuerRef": {"name": "ca"}}},
            },
        ),
        merged(INFERENCE, {"injector": {"enabled": False}}),
        merged(
            INFERENCE,
            {"inference": {"cudaIPC": {"enabled": True, "sidecarVisibleDevices": "all"}}},
        ),
    ],
    ids=["defaults", "external-relay", "cert-manager", "webhook-off", "cuda-ipc"],
)
def test_every_manifest_of_the_value_matrix_validates(
    tmp_path: Path, values: dict[str, Any]
) -> None:
    """Strictly, for the oldest Kubernetes with native sidecars and the newest the validator
    knows; helm lint as well."""
    assert tuple(map(int, KUBERNETES_VERSIONS[1].split("."))) >= (1, 33), KUBERNETES_VERSIONS
    docs = render(tmp_path, values)
    validate(tmp_path, yaml.safe_dump_all([d for d in docs if d["kind"] not in CRD_KINDS]))
    result = helm("lint", "--strict", CHART, "-f", values_file(tmp_path, values))
    assert result.returncode == 0, result.stdout + result.stderr
