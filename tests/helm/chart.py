"""The Helm chart (helm/kvmoq) as the tests render it: a real helm, manifests parsed, and
kubernetes-validate (Kubernetes' JSON schemas, offline) for what is rendered.

helm and kubernetes-validate come from scripts/setup.sh into .tools/; without them (no helm
build for this CPU) the modules that need them skip.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "kvmoq"
HELM = ROOT / ".tools" / "bin" / "helm"
VALIDATE = ROOT / ".tools" / "venv" / "bin" / "kubernetes-validate"
OLDEST_KUBERNETES = "1.29.0"
"""Native sidecars (restartPolicy: Always on an init container) are on by default from 1.29."""


def newest_kubernetes() -> str:
    """The newest Kubernetes version whose schemas kubernetes-validate ships."""
    schemas = ROOT.glob(
        ".tools/venv/lib/python*/site-packages/kubernetes_validate/kubernetes-json-schema/"
        "v*-local-strict"
    )
    versions = [path.name.removeprefix("v").removesuffix("-local-strict") for path in schemas]
    return max(versions, key=lambda v: tuple(map(int, v.split("."))), default=OLDEST_KUBERNETES)


KUBERNETES_VERSIONS = (OLDEST_KUBERNETES, newest_kubernetes())

needs_helm = pytest.mark.skipif(
    not HELM.exists(), reason="no .tools/bin/helm (scripts/setup.sh installs it on x86_64)"
)

MODEL = {
    "name": "vllm",
    "image": "vllm/vllm-openai:v0.11.0",
    "args": ["--model", "Qwen/Qwen3-0.6B"],
    "ports": [{"name": "http", "containerPort": 8000}],
    "env": [{"name": "HF_HOME", "value": "/models"}],
    "volumeMounts": [{"name": "models", "mountPath": "/models"}],
    "resources": {"limits": {"nvidia.com/gpu": 1}},
}
INFERENCE = {
    "inference": {
        "enabled": True,
        "container": MODEL,
        "volumes": [{"name": "models", "emptyDir": {}}],
    }
}

EDGES = {"relay": {"edges": {"enabled": True}}}


def merged(*trees: dict[str, Any]) -> dict[str, Any]:
    """Nested dicts merged left to right, as helm merges several -f files."""
    out: dict[str, Any] = {}
    for tree in trees:
        for key, value in tree.items():
            if isinstance(value, dict) and isinstance(out.get(key), dict):
                out[key] = merged(out[key], value)
            else:
                out[key] = value
    return out


def helm(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(HELM), *map(str, args)], capture_output=True, text=True, timeout=60, check=False
    )


def values_file(tmp_path: Path, values: dict[str, Any]) -> Path:
    path = tmp_path / f"values-{len(list(tmp_path.glob('values-*')))}.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def render_text(tmp_path: Path, values: dict[str, Any], chart: Path = CHART) -> str:
    result = helm("template", "r", chart, "-f", values_file(tmp_path, values))
    assert result.returncode == 0, result.stderr
    return result.stdout


def render(tmp_path: Path, values: dict[str, Any], chart: Path = CHART) -> list[dict[str, Any]]:
    docs = yaml.safe_load_all(render_text(tmp_path, values, chart))
    return [doc for doc in docs if doc]


def render_error(tmp_path: Path, values: dict[str, Any]) -> str:
    result = helm("template", "r", CHART, "-f", values_file(tmp_path, values))
    assert result.returncode != 0, f"rendered although it should fail:\n{result.stdout}"
    return result.stderr


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, [(d["kind"], d["metadata"]["name"]) for d in docs]
    return matches[0]


def pod(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return find(docs, "Deployment", "r-inference")["spec"]["template"]


def container(spec: dict[str, Any], name: str, key: str = "containers") -> dict[str, Any]:
    (match,) = [c for c in spec.get(key, []) if c["name"] == name]
    return match


def env(c: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in c.get("env", [])}


def mounts(c: dict[str, Any]) -> dict[str, str]:
    return {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}


def validate(tmp_path: Path, text: str) -> None:
    """Every rendered object against Kubernetes' own schemas, unknown fields rejected."""
    path = tmp_path / "rendered.yaml"
    path.write_text(text)
    for version in KUBERNETES_VERSIONS:
        result = subprocess.run(
            [str(VALIDATE), "--strict", "--quiet", "-k", version, str(path)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert result.returncode == 0, result.stdout + result.stderr
