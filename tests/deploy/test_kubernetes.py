"""deploy/kubernetes, offline: rendered as kustomize would, validated against Kubernetes'
own schemas (kubernetes-validate ships them) and KEDA's ScaledObject schema kept in the
repo; the autoscaler's query is the `worker_demand` statement, run on a real database."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import jsonschema
import kubernetes_validate
import pytest
import yaml

from darkroom.config import load_settings
from darkroom.db.connection import open_pool
from darkroom.db.database import Database
from darkroom.db.queries import QUERIES
from darkroom.errors import ErrorCode
from darkroom.queue import ConfirmOutcome, Derived, derived_key
from darkroom.stats import worker_demand
from tests.support.services import confirm, make_queue

ROOT = Path(__file__).resolve().parents[2]
KUSTOMIZATION = ROOT / "deploy" / "kubernetes"
KEDA_SCHEMA = KUSTOMIZATION / "schemas" / "keda-scaledobject-v1alpha1.yaml"
# The oldest Kubernetes the manifests promise to work on, and the newest schemas shipped.
K8S_VERSIONS = ("1.29.0", kubernetes_validate.latest_version())
CLUSTER_SCOPED = {"Namespace"}
# The kustomization fields this renderer understands; anything else fails the test
# rather than being silently ignored.
KNOWN_FIELDS = {"apiVersion", "kind", "namespace", "labels", "resources", "images"}


def render(directory: Path) -> list[dict[str, Any]]:
    """`kubectl kustomize DIRECTORY` for the subset of kustomize darkroom's files use."""
    spec = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(spec) - KNOWN_FIELDS
    assert not unknown, f"renderer does not support kustomization fields {unknown}"
    docs: list[dict[str, Any]] = []
    for resource in spec["resources"]:
        path = directory / resource
        if path.is_dir():
            docs += render(path)
        else:
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    images = {i["name"]: f"{i.get('newName', i['name'])}:{i['newTag']}"
              for i in spec.get("images", [])}
    for doc in docs:
        meta = doc.setdefault("metadata", {})
        if "namespace" in spec and doc["kind"] not in CLUSTER_SCOPED:
            meta["namespace"] = spec["namespace"]
        for group in spec.get("labels", []):
            assert not group.get("includeSelectors") and not group.get("includeTemplates")
            meta.setdefault("labels", {}).update(group["pairs"])
        for container in containers(doc):
            container["image"] = images.get(container["image"], container["image"])
    return docs


def pod_spec(doc: dict[str, Any]) -> dict[str, Any] | None:
    spec: dict[str, Any] | None = (
        doc.get("spec", {}).get("template", {}).get("spec")
        if doc["kind"] in {"Deployment", "Job", "StatefulSet", "DaemonSet"} else None)
    return spec


def containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod_spec(doc)
    return [] if spec is None else [*spec.get("initContainers", []), *spec["containers"]]


@pytest.fixture(scope="module")
def docs() -> list[dict[str, Any]]:
    return render(KUSTOMIZATION)


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def config(docs: list[dict[str, Any]]) -> dict[str, str]:
    data: dict[str, str] = one(docs, "ConfigMap", "darkroom")["data"]
    return data


def sql_text(query: str) -> str:
    """A statement without its comments and with whitespace normalized."""
    lines = [line for line in query.splitlines() if not line.strip().startswith("--")]
    return re.sub(r"\s+", " ", " ".join(lines)).strip()


def test_every_object_validates_against_the_kubernetes_schemas(
        docs: list[dict[str, Any]]) -> None:
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "Service", "Job", "PodDisruptionBudget", "ConfigMap",
            "ScaledObject"} <= kinds
    for doc in docs:
        if doc["apiVersion"].startswith("keda.sh/"):
            continue
        for version in K8S_VERSIONS:
            # strict: an unknown (e.g. misspelt) field is an error, not pruned
            kubernetes_validate.validate(doc, version, strict=True)


def test_the_scaled_object_validates_against_kedas_schema(docs: list[dict[str, Any]]) -> None:
    schema = yaml.safe_load(KEDA_SCHEMA.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    scaled = one(docs, "ScaledObject", "darkroom-worker")
    jsonschema.Draft202012Validator(schema).validate(scaled)
    # The HPA behavior KEDA passes through is Kubernetes' own type: check it as one.
    behavior = scaled["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    hpa = {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
           "metadata": {"name": "check"},
           "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                       "name": "darkroom-worker"},
                    "maxReplicas": scaled["spec"]["maxReplicaCount"], "behavior": behavior}}
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(hpa, version, strict=True)


def test_the_schema_catches_a_misspelt_field(docs: list[dict[str, Any]]) -> None:
    schema = yaml.safe_load(KEDA_SCHEMA.read_text())
    scaled = copy.deepcopy(one(docs, "ScaledObject", "darkroom-worker"))
    scaled["spec"]["minReplicas"] = 1
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(schema).validate(scaled)
    scaled = copy.deepcopy(one(docs, "ScaledObject", "darkroom-worker"))
    scaled["spec"]["triggers"][0]["metadata"]["targetValue"] = "2"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(schema).validate(scaled)


def test_the_scaler_runs_the_stats_query_per_worker_slot(docs: list[dict[str, Any]]) -> None:
    scaled = one(docs, "ScaledObject", "darkroom-worker")
    worker = one(docs, "Deployment", "darkroom-worker")
    assert scaled["spec"]["scaleTargetRef"]["name"] == worker["metadata"]["name"]
    [trigger] = scaled["spec"]["triggers"]
    assert trigger["type"] == "postgresql"
    meta = trigger["metadata"]
    assert sql_text(meta["query"]) == sql_text(QUERIES["worker_demand"])
    [container] = containers(worker)
    args = container["args"]
    slots = args[args.index("--concurrency") + 1]
    assert float(meta["targetQueryValue"]) == float(slots)
    # KEDA resolves the connection from the target container's environment, which gets
    # it from the Secret: the same variable darkroom itself reads.
    assert meta["connectionFromEnv"] == "DARKROOM_DATABASE_URL"
    assert {"secretRef": {"name": "darkroom"}} in container["envFrom"]


def test_every_pod_runs_unprivileged_under_runtime_default_seccomp(
        docs: list[dict[str, Any]]) -> None:
    user = re.search(r"^USER (\d+):(\d+)$", (ROOT / "Containerfile").read_text(), re.M)
    assert user is not None
    pods = [d for d in docs if pod_spec(d) is not None]
    assert {d["metadata"]["name"] for d in pods} == {
        "darkroom-api", "darkroom-worker", "darkroom-sweeper", "darkroom-migrate"}
    for doc in pods:
        spec = pod_spec(doc)
        assert spec is not None
        pod = spec["securityContext"]
        assert pod["runAsNonRoot"] is True
        assert str(pod["runAsUser"]) == user[1] and str(pod["runAsGroup"]) == user[2]
        assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
        assert spec["automountServiceAccountToken"] is False
        tmp = {v["name"] for v in spec["volumes"] if "emptyDir" in v}
        for container in containers(doc):
            sec = container["securityContext"]
            assert sec["allowPrivilegeEscalation"] is False
            assert sec["readOnlyRootFilesystem"] is True
            assert sec["capabilities"] == {"drop": ["ALL"]}
            # The only writable path: uploads spool and decoders' scratch live here.
            assert {(m["name"], m["mountPath"]) for m in container["volumeMounts"]} == {
                (name, "/tmp") for name in tmp}
            assert container["image"] == "registry.example.com/darkroom:0.1.0"


def test_configuration_is_valid_and_the_kill_timeout_exceeds_the_grace(
        docs: list[dict[str, Any]]) -> None:
    data = config(docs)
    settings = load_settings(**{k.removeprefix("DARKROOM_").lower(): v
                                for k, v in data.items() if k.startswith("DARKROOM_")})
    for name in ("darkroom-worker", "darkroom-api", "darkroom-sweeper"):
        spec = pod_spec(one(docs, "Deployment", name))
        assert spec is not None
        assert spec["terminationGracePeriodSeconds"] >= settings.shutdown_grace_seconds + 10


def test_probes_ask_the_right_endpoints(docs: list[dict[str, Any]]) -> None:
    [api] = containers(one(docs, "Deployment", "darkroom-api"))
    assert api["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert api["livenessProbe"]["httpGet"]["path"] == "/healthz"
    port = api["args"][api["args"].index("--port") + 1]
    assert [p["containerPort"] for p in api["ports"]] == [int(port)]
    [worker] = containers(one(docs, "Deployment", "darkroom-worker"))
    metrics_port = worker["args"][worker["args"].index("--metrics-port") + 1]
    assert worker["args"][worker["args"].index("--metrics-host") + 1] == "0.0.0.0"
    assert worker["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert [p["containerPort"] for p in worker["ports"]] == [int(metrics_port)]


def test_selectors_match_their_pods(docs: list[dict[str, Any]]) -> None:
    labels = {d["metadata"]["name"]: d["spec"]["template"]["metadata"]["labels"]
              for d in docs if d["kind"] in {"Deployment", "Job"}}
    for doc in docs:
        if doc["kind"] in {"Deployment", "PodDisruptionBudget"}:
            selector = doc["spec"]["selector"]["matchLabels"]
        elif doc["kind"] == "Service":
            selector = doc["spec"]["selector"]
        else:
            continue
        target = labels[doc["metadata"]["name"]]
        assert selector.items() <= target.items(), doc["metadata"]["name"]


async def test_worker_demand_counts_processing_and_due_cards(db_url: str) -> None:
    """On a real database: the figure `darkroom stats` shows, and KEDA's query text."""
    pool = await open_pool(db_url, min_size=1, max_size=2)
    try:
        q = make_queue(pool, retry_base_seconds=3600.0, retry_cap_seconds=3600.0)
        assert await worker_demand(Database(pool)) == 0
        ids = []
        for i in range(7):
            c = await q.create_file(owner="o", filename=f"{i}.jpg", content_type="image/jpeg",
                                    size=1)
            assert await confirm(q, c.id, "o", "v1") is ConfirmOutcome.QUEUED
            ids.append(c.id)
        await q.create_file(owner="o", filename="p.jpg", content_type="image/jpeg", size=1)
        assert await worker_demand(Database(pool)) == 7  # pending cards are not work yet
        done, retried, running = await q.claim(3)
        await q.complete(done, Derived(key=derived_key(done), version="d", sha256="0" * 64,
                                       width=1, height=1, size=1))
        # A transient failure waits an hour before it is due again: not demand now.
        assert await q.fail(retried, ErrorCode.STORAGE_UNAVAILABLE) == "queued"
        # 1 processing + 4 due queued; the ready and the backed-off cards are not demand.
        assert await worker_demand(Database(pool)) == 5
        async with pool.connection() as conn:
            scaled = render(KUSTOMIZATION)
            query = one(scaled, "ScaledObject", "darkroom-worker")["spec"]["triggers"][0][
                "metadata"]["query"]
            cur = await conn.execute(query)
            row = await cur.fetchone()
        # The pool answers rows as dicts (darkroom.db.connection).
        assert row is not None and list(cast("dict[str, Any]", row).values()) == [5.0]
        assert running.file_id in ids
    finally:
        await pool.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DARKROOM_")}
    out = subprocess.run([sys.executable, "-m", "darkroom.cli", "stats", "--json"],
                         env={**env, "DARKROOM_DATABASE_URL": db_url}, capture_output=True,
                         text=True, timeout=120, check=True)
    assert json.loads(out.stdout)["worker_demand"] == 5
