"""`kvmoq injector`, for real: the chart renders its injection template, the injector serves
it over HTTPS on loopback, AdmissionReviews go in as the API server sends them, and the
JSONPatch that comes back is applied with `jsonpatch` and the pod checked against
Kubernetes' schemas and against the chart's own inference pod."""

from __future__ import annotations

import base64
import copy
import http.client
import json
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonpatch
import pytest
import yaml
from kvmoq_client.vllm.settings import kv_transfer_config

from sidecar.demo.children import Children
from sidecar.injector.review import MAX_REVIEW_BYTES
from sidecar.moqt.aio.tls import write_certificate
from tests.helm.chart import (
    INFERENCE,
    MODEL,
    container,
    env,
    find,
    merged,
    mounts,
    needs_helm,
    pod,
    render,
    render_text,
    validate,
)

pytestmark = needs_helm

LABELS = {"kvmoq.io/inject": "true"}
START_S = 60.0


@dataclass
class Injector:
    host: str
    port: int
    context: ssl.SSLContext

    def connect(self) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(self.host, self.port, context=self.context, timeout=10)

    def post(self, body: bytes, path: str = "/inject") -> tuple[int, bytes]:
        connection = self.connect()
        try:
            connection.request("POST", path, body, {"Content-Type": "application/json"})
            answer = connection.getresponse()
            return answer.status, answer.read()
        finally:
            connection.close()

    def review(self, pod: dict[str, Any], kind: str = "Pod") -> dict[str, Any]:
        review = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0",
                "kind": {"group": "", "version": "v1", "kind": kind},
                "resource": {"group": "", "version": "v1", "resource": kind.lower() + "s"},
                "namespace": "serving",
                "operation": "CREATE",
                "object": pod,
            },
        }
        status, body = self.post(json.dumps(review).encode())
        assert status == 200, body
        answer = json.loads(body)
        assert answer["apiVersion"] == "admission.k8s.io/v1"
        assert answer["kind"] == "AdmissionReview"
        assert answer["response"]["uid"] == review["request"]["uid"]
        return answer["response"]

    def healthy(self) -> bool:
        connection = self.connect()
        try:
            connection.request("GET", "/healthz")
            return connection.getresponse().status == 200
        finally:
            connection.close()


def injected(injector: Injector, pod: dict[str, Any]) -> dict[str, Any]:
    """The pod as the API server stores it after the injector's patch."""
    response = injector.review(pod)
    assert response["allowed"] is True, response
    assert response["patchType"] == "JSONPatch"
    patch = json.loads(base64.b64decode(response["patch"]))
    return jsonpatch.apply_patch(pod, patch)


def template_json(tmp_path: Path, values: dict[str, Any]) -> str:
    config_map = find(render(tmp_path, values), "ConfigMap", "r-kvmoq-injection")
    return config_map["data"]["template.json"]


def start_injector(children: Children, scratch: Path, template: str) -> Injector:
    cert = write_certificate(scratch)
    (scratch / "template.json").write_text(template)
    child = children.start(
        "injector",
        [
            sys.executable, "-m", "sidecar.cli", "injector", "--listen", "127.0.0.1:0",
            "--cert", str(cert.cert), "--key", str(cert.key),
            "--template", str(scratch / "template.json"),
        ],
        ready_prefix='{"event": "serving"',
        timeout=START_S,
    )  # fmt: skip
    url = urlsplit(json.loads(child.ready_line)["url"])
    assert url.path == "/inject"
    context = ssl.create_default_context(cafile=str(cert.cert))
    assert url.hostname is not None and url.port is not None
    return Injector(url.hostname, url.port, context)


@pytest.fixture(scope="module")
def injector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Injector]:
    scratch = tmp_path_factory.mktemp("injector")
    with Children() as children:
        yield start_injector(children, scratch, template_json(scratch, {}))


def a_pod(*containers: dict[str, Any], **annotations: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "vllm-decode-",
            "namespace": "serving",
            "labels": {**LABELS, "app": "vllm"},
            "annotations": annotations,
        },
        "spec": {"containers": list(containers) or [copy.deepcopy(MODEL)]},
    }


def sidecars(spec: dict[str, Any]) -> list[dict[str, Any]]:
    every = [*spec.get("initContainers", []), *spec["containers"]]
    return [c for c in every if c["name"] == "kvmoq-sidecar"]


def validate_pod(tmp_path: Path, pod: dict[str, Any]) -> None:
    validate(tmp_path, yaml.safe_dump({**pod, "metadata": {**pod["metadata"], "name": "p"}}))


def test_a_vllm_pod_gets_the_sidecar_and_its_kv_transfer_config(
    injector: Injector, tmp_path: Path
) -> None:
    config = {"load_deadline": 2, "tracks": "fp16,int8"}
    original = a_pod(
        **{
            "kvmoq.io/vllm-container": "vllm",
            "kvmoq.io/vllm-role": "kv_consumer",
            "kvmoq.io/vllm-config": json.dumps(config),
        }
    )
    result = injected(injector, original)
    validate_pod(tmp_path, result)
    spec = result["spec"]
    (sidecar,) = sidecars(spec)
    assert spec["initContainers"] == [sidecar]  # native: the first init container
    vllm = container(spec, "vllm")
    flag, value = vllm["args"][-2:]
    assert vllm["args"][:-2] == MODEL["args"] and flag == "--kv-transfer-config"
    socket_target = "unix:///run/kvmoq/sidecar.sock"
    assert json.loads(value) == kv_transfer_config(
        "kv_consumer", {"sidecar": socket_target, **config}
    )
    assert env(vllm) == {"KVMOQ_GRPC": socket_target, "HF_HOME": "/models"}
    assert mounts(vllm) == {
        "/models": "models",
        "/run/kvmoq": "kvmoq-socket",
        "/dev/shm": "kvmoq-shm",
    }
    assert {v["name"] for v in spec["volumes"]} == {"kvmoq-socket", "kvmoq-shm", "kvmoq-ca"}
    assert result["metadata"]["labels"]["kvmoq.io/sidecar"] == "true"
    assert result["metadata"]["annotations"]["kvmoq.io/status"] == "injected"
    # A second pass (a reinvocation, a re-sent review) leaves the injected pod alone, and
    # so does a pod that carries the sidecar already (rendered from the named templates).
    by_hand = copy.deepcopy(result)
    del by_hand["metadata"]["annotations"]["kvmoq.io/status"]
    for done in (result, by_hand):
        response = injector.review(done)
        assert response["allowed"] is True and "patch" not in response


def test_the_injected_sidecar_is_the_one_the_chart_renders(
    injector: Injector, tmp_path: Path
) -> None:
    """One source: the chart's inference Deployment and an injected pod carry the same
    sidecar container, volumes and scrape annotations, for the same values; the pod's own
    annotations win."""
    chart_pod = pod(render(tmp_path, INFERENCE))
    chart = chart_pod["spec"]
    model = copy.deepcopy(MODEL)
    patched = injected(injector, a_pod(model, **{"prometheus.io/path": "/own"}))
    result = patched["spec"]
    scrape = {
        key: value
        for key, value in chart_pod["metadata"]["annotations"].items()
        if key.startswith("prometheus.io/")
    }
    assert set(scrape) == {"prometheus.io/scrape", "prometheus.io/port", "prometheus.io/path"}
    assert patched["metadata"]["annotations"] == {
        **scrape,
        "prometheus.io/path": "/own",
        "kvmoq.io/status": "injected",
    }
    assert sidecars(result) == sidecars(chart)
    assert container(result, "vllm") == container(chart, "vllm")
    assert result["volumes"] == [v for v in chart["volumes"] if v["name"] != "models"]


def test_unlabelled_pods_and_other_kinds_are_left_alone(injector: Injector) -> None:
    plain = a_pod()
    plain["metadata"]["labels"] = {"app": "web"}
    for response in (
        injector.review(plain),
        injector.review({"metadata": {"name": "c"}, "data": {}}, kind="ConfigMap"),
    ):
        assert response == {"uid": response["uid"], "allowed": True}


@pytest.mark.parametrize(
    ("annotations", "message"),
    [
        ({"kvmoq.io/tracks": "fp16,fp17"}, "kvmoq.io/tracks: unknown compression fp17"),
        ({"kvmoq.io/relay-url": "https://relay:443"}, "kvmoq.io/relay-url: not a moqt:// URL"),
        ({"kvmoq.io/resources": "{bad"}, "kvmoq.io/resources: not JSON"),
        ({"kvmoq.io/inject-me": "yes"}, "unknown annotation kvmoq.io/inject-me"),
        ({"kvmoq.io/vllm-container": "llm"}, "the pod has no container 'llm'"),
        (
            {"kvmoq.io/vllm-container": "vllm", "kvmoq.io/vllm-config": '{"deadline": 1}'},
            "unknown keys ['deadline']",
        ),
        ({"kvmoq.io/vllm-role": "kv_both"}, "without kvmoq.io/vllm-container"),
        (
            {"kvmoq.io/vllm-container": "vllm", "kvmoq.io/vllm-role": "both"},
            "kvmoq.io/vllm-role: expected one of kv_producer, kv_consumer, kv_both",
        ),
        ({"kvmoq.io/cuda-ipc": "true"}, "needs the sidecar to see the model server's GPU"),
    ],
)
def test_pods_it_cannot_inject_are_refused_with_the_reason(
    injector: Injector, annotations: dict[str, str], message: str
) -> None:
    response = injector.review(a_pod(**annotations))
    assert response["allowed"] is False
    assert response["status"]["code"] == 400
    assert message in response["status"]["message"], response


def test_a_pod_that_holds_the_sidecars_socket_path_is_refused(injector: Injector) -> None:
    model = {**copy.deepcopy(MODEL), "volumeMounts": [{"name": "run", "mountPath": "/run/kvmoq"}]}
    response = injector.review(a_pod(model))
    assert response["allowed"] is False
    assert "mounts /run/kvmoq" in response["status"]["message"]


def test_annotations_adjust_the_sidecar(injector: Injector, tmp_path: Path) -> None:
    resources = {"requests": {"cpu": "4", "memory": "12Gi"}, "limits": {"memory": "16Gi"}}
    result = injected(
        injector,
        a_pod(
            **{
                "kvmoq.io/relay-url": "moqt://edge.kv:4443",
                "kvmoq.io/tracks": "fp16, ac",
                "kvmoq.io/resources": json.dumps(resources),
            }
        ),
    )
    validate_pod(tmp_path, result)
    (sidecar,) = sidecars(result["spec"])
    assert env(sidecar)["KVMOQ_RELAY"] == "moqt://edge.kv:4443"
    assert env(sidecar)["KVMOQ_TRACKS"] == "fp16,ac"
    assert sidecar["resources"] == resources


def test_cuda_ipc_shares_the_pid_namespace_and_the_gpu_as_the_chart_does(
    injector: Injector, tmp_path: Path
) -> None:
    claims = [{"name": "gpu"}]
    model = {**copy.deepcopy(MODEL), "resources": {"claims": claims}}
    result = injected(injector, a_pod(model, **{"kvmoq.io/cuda-ipc": "true"}))
    spec = result["spec"]
    assert spec["shareProcessNamespace"] is True
    chart = pod(
        render(
            tmp_path,
            merged(INFERENCE, {"inference": {"container": model, "cudaIPC": {"enabled": True}}}),
        )
    )["spec"]
    assert sidecars(spec) == sidecars(chart)
    # Device-plugin GPUs: the sidecar is told which devices to see.
    devices = injected(
        injector, a_pod(**{"kvmoq.io/cuda-ipc": "true", "kvmoq.io/visible-devices": "all"})
    )
    (sidecar,) = sidecars(devices["spec"])
    assert env(sidecar)["NVIDIA_VISIBLE_DEVICES"] == "all"


def test_a_pod_with_its_own_shared_memory_volume_shares_it(
    injector: Injector, tmp_path: Path
) -> None:
    """vLLM's charts mount an in-memory /dev/shm of their own: the sidecar mounts that one
    (shared-memory KV buffers must be in one filesystem) and no second one is added."""
    model = {
        **copy.deepcopy(MODEL),
        "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}],
    }
    original = a_pod(model)
    original["spec"]["volumes"] = [{"name": "shm", "emptyDir": {"medium": "Memory"}}]
    result = injected(injector, original)
    validate_pod(tmp_path, result)
    spec = result["spec"]
    (sidecar,) = sidecars(spec)
    assert mounts(sidecar)["/dev/shm"] == "shm"
    assert mounts(container(spec, "vllm")) == {"/dev/shm": "shm", "/run/kvmoq": "kvmoq-socket"}
    assert "kvmoq-shm" not in {v["name"] for v in spec["volumes"]}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"\x00garbage", b"not JSON"),
        (b'{"apiVersion": "v1", "kind": "Pod"}', b"expected an admission.k8s.io/v1"),
        (b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}', b"no request"),
    ],
    ids=["garbage", "not-a-review", "no-request"],
)
def test_malformed_reviews_get_a_clear_400_and_the_injector_stays_up(
    injector: Injector, body: bytes, message: bytes
) -> None:
    status, answer = injector.post(body)
    assert status == 400 and message in answer, (status, answer)
    assert injector.healthy()
    assert injector.review(a_pod())["allowed"] is True


def test_an_oversized_review_is_refused_from_its_headers(injector: Injector) -> None:
    """The injector answers from the Content-Length, without reading the body."""
    connection = injector.connect()
    try:
        connection.putrequest("POST", "/inject")
        connection.putheader("Content-Length", str(MAX_REVIEW_BYTES + 1))
        connection.endheaders()  # no body: bytes left unread would reset the connection
        answer = connection.getresponse()
        assert answer.status == 400
        assert b"body longer than" in answer.read()
    finally:
        connection.close()
    assert injector.healthy()


def test_a_stalled_client_holds_up_no_one_else(injector: Injector) -> None:
    with socket.create_connection((injector.host, injector.port)):
        # Connected, never says a word (not even a TLS hello).
        assert injector.review(a_pod())["allowed"] is True


def test_a_plain_container_sidecar_for_older_clusters(tmp_path: Path) -> None:
    with Children() as children:
        template = template_json(tmp_path, {"sidecar": {"native": False}})
        injector = start_injector(children, tmp_path / "plain", template)
        result = injected(injector, a_pod())
    validate_pod(tmp_path, result)
    spec = result["spec"]
    assert "initContainers" not in spec
    assert [c["name"] for c in spec["containers"]] == ["vllm", "kvmoq-sidecar"]
    assert "restartPolicy" not in spec["containers"][1]


def test_a_template_that_is_not_the_charts_stops_the_injector_at_once(tmp_path: Path) -> None:
    cert = write_certificate(tmp_path)
    (tmp_path / "template.json").write_text('{"sidecar": {"name": "other"}}')
    result = subprocess.run(
        [
            sys.executable, "-m", "sidecar.cli", "injector", "--cert", str(cert.cert),
            "--key", str(cert.key), "--template", str(tmp_path / "template.json"),
        ],
        capture_output=True, text=True, timeout=START_S, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert "kvmoq injector: the sidecar container must be named kvmoq-sidecar" in result.stdout


def test_the_chart_deploys_the_injector(tmp_path: Path) -> None:
    docs = render(tmp_path, {})
    deployment = find(docs, "Deployment", "r-kvmoq-injector")
    assert deployment["spec"]["replicas"] == 2
    budget = find(docs, "PodDisruptionBudget", "r-kvmoq-injector")
    assert budget["spec"]["minAvailable"] == 1
    (webhook,) = find(docs, "MutatingWebhookConfiguration", "r-kvmoq-injector")["webhooks"]
    assert webhook["objectSelector"] == {"matchLabels": LABELS}
    # Namespaces opt in: each must hold the Secrets the sidecar mounts (docs/operations.md).
    assert webhook["namespaceSelector"] == {"matchLabels": {"kvmoq.io/injection": "enabled"}}
    assert webhook["failurePolicy"] == "Fail"
    assert webhook["reinvocationPolicy"] == "Never"
    assert webhook["timeoutSeconds"] == 10
    assert webhook["clientConfig"]["service"]["path"] == "/inject"
    # Without cert-manager the chart makes the CA: the webhook trusts the Secret's CA.
    secret = find(docs, "Secret", "r-kvmoq-injector-tls")
    assert webhook["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
    server = ssl.PEM_cert_to_DER_cert(base64.b64decode(secret["data"]["tls.crt"]).decode())
    assert server  # a PEM certificate
    validate(tmp_path, render_text(tmp_path, {}))

    # With cert-manager: a Certificate, and cainjector fills the caBundle.
    docs = render(tmp_path, {"injector": {"certManager": {"enabled": True}}})
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert ("Certificate", "r-kvmoq-injector") in kinds
    assert ("Issuer", "r-kvmoq-injector-selfsigned") in kinds
    assert ("Secret", "r-kvmoq-injector-tls") not in kinds
    configuration = find(docs, "MutatingWebhookConfiguration", "r-kvmoq-injector")
    assert configuration["metadata"]["annotations"] == {
        "cert-manager.io/inject-ca-from": "default/r-kvmoq-injector"
    }
    assert "caBundle" not in configuration["webhooks"][0]["clientConfig"]

    docs = render(tmp_path, {"injector": {"enabled": False}})
    assert not [d for d in docs if "injector" in d["metadata"]["name"]]
