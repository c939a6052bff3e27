"""deploy/k8s/values.yaml through dagster-k8s's real K8sRunLauncher, offline.

No cluster is reachable here, so the Kubernetes API is a small fake on 127.0.0.1 that accepts Jobs
and keeps them. The instance and the code server are configured the way the Dagster Helm chart
configures them from these values (the launcher's config from `runLauncher`, and the code server's
DAGSTER_CONTAINER_IMAGE / DAGSTER_CONTAINER_CONTEXT from the deployment, since
`includeConfigInLaunchedRuns` is on). `dagster job launch` then makes the launcher render and submit
each run's Job; the test checks the manifest, and runs the Job's container command as its pod would
(its env, the Secret's values, the ledger on a real S3 API), to success.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import dagster as dg
import kubernetes
import pytest
import yaml

from hermes_assets.cli import batch_main
from hermes_core.config import data_root
from hermes_core.batch.object_ledger import ObjectLedger
from procs import free_port, wait_until
from s3_server import CREDENTIALS, s3_endpoint, s3_ledger  # noqa: F401  (fixtures)
from dagster_runs import DAGSTER, ROOT, launch, story, wait_for

BIN = Path(sys.executable).parent
VALUES = yaml.safe_load((ROOT / "deploy/k8s/values.yaml").read_text())
DEPLOYMENT = VALUES["dagster-user-deployments"]["deployments"][0]
NAMESPACE = "hermes"


class FakeKubernetesAPI(ThreadingHTTPServer):
    """Accepts `POST /apis/batch/v1/namespaces/<ns>/jobs` and keeps the Jobs; anything else is a 404."""

    def __init__(self) -> None:
        self.jobs: list[dict[str, Any]] = []
        self.other_requests: list[str] = []
        super().__init__(("127.0.0.1", 0), _KubernetesHandler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _KubernetesHandler(BaseHTTPRequestHandler):
    server: FakeKubernetesAPI

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs":
            self.server.jobs.append(body)
            self._reply(201, body)
        else:
            self._not_found()

    def do_GET(self) -> None:  # noqa: N802
        self._not_found()

    def _not_found(self) -> None:
        self.server.other_requests.append(f"{self.command} {self.path}")
        self._reply(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404})

    def _reply(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture()
def kube_api() -> Iterator[FakeKubernetesAPI]:
    server = FakeKubernetesAPI()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()


def camel_to_snake(name: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name)


def launcher_config(kubeconfig: Path, home: Path) -> dict[str, Any]:
    """K8sRunLauncher's config as the chart writes it from `runLauncher.config.k8sRunLauncher`, plus
    what the chart fills in itself; the API comes from a kubeconfig instead of the pod's account."""
    values = VALUES["runLauncher"]["config"]["k8sRunLauncher"]
    return {
        "load_incluster_config": False, "kubeconfig_file": str(kubeconfig), "job_namespace": NAMESPACE,
        "service_account_name": "hermes-dagster", "instance_config_map": "hermes-dagster-instance",
        "postgres_password_secret": VALUES["global"]["postgresqlSecretName"], "dagster_home": str(home),
        "image_pull_policy": values["imagePullPolicy"], "env_config_maps": values["envConfigMaps"],
        "env_secrets": [secret["name"] for secret in values["envSecrets"]], "env_vars": values["envVars"],
        "volumes": values["volumes"], "volume_mounts": values["volumeMounts"],
        "fail_pod_on_run_failure": values["failPodOnRunFailure"],
        "run_k8s_config": {camel_to_snake(key): value for key, value in values["runK8sConfig"].items()},
    }


def instance_concurrency() -> dict[str, Any]:
    """The instance's `concurrency` section as the chart writes it from `concurrency`."""
    values = VALUES["concurrency"]
    assert values["enabled"]
    return {"pools": {"default_limit": values["pools"]["defaultLimit"]},
            "runs": {"max_concurrent_runs": values["runs"]["maxConcurrentRuns"]}}


def container_context() -> dict[str, Any]:
    """What the chart hands the code server (DAGSTER_CONTAINER_CONTEXT) for a deployment whose
    `includeConfigInLaunchedRuns` is on: its image policy, env, secrets and volumes."""
    assert DEPLOYMENT["includeConfigInLaunchedRuns"]["enabled"]
    return {"k8s": {
        "namespace": NAMESPACE, "image_pull_policy": DEPLOYMENT["image"]["pullPolicy"], "env": DEPLOYMENT["env"],
        "env_secrets": [secret["name"] for secret in DEPLOYMENT["envSecrets"]],
        "volumes": DEPLOYMENT["volumes"], "volume_mounts": DEPLOYMENT["volumeMounts"],
    }}


def secrets() -> dict[str, dict[str, str]]:
    documents = yaml.safe_load_all((ROOT / "deploy/k8s/secret.example.yaml").read_text())
    return {doc["metadata"]["name"]: doc["stringData"] for doc in documents}


def as_model(manifest: dict[str, Any], kind: str) -> Any:
    """The manifest read by the Kubernetes client's own models: unknown types or fields fail here."""

    class Response:
        data = json.dumps(manifest)

    return kubernetes.client.ApiClient().deserialize(Response(), kind)


def test_the_deploy_files_name_each_other_and_parse_as_kubernetes_objects() -> None:
    named = secrets()
    assert {secret["name"] for secret in DEPLOYMENT["envSecrets"]} <= set(named)
    assert "postgresql-password" in named[VALUES["global"]["postgresqlSecretName"]]
    assert "HERMES_API_KEY" in named["hermes-foundry-secrets"]
    for document in yaml.safe_load_all((ROOT / "deploy/k8s/secret.example.yaml").read_text()):
        assert as_model(document, "V1Secret").string_data
    volume = yaml.safe_load((ROOT / "deploy/k8s/data-volume.yaml").read_text())
    claim = as_model(volume, "V1PersistentVolumeClaim")
    assert claim.spec.access_modes == ["ReadWriteMany"]
    assert [v["persistentVolumeClaim"]["claimName"] for v in DEPLOYMENT["volumes"]] == [claim.metadata.name]
    env = {e["name"]: e["value"] for e in DEPLOYMENT["env"]}
    assert env["HERMES_LEDGER_URL"].startswith("s3://") and env["HERMES_DATA_DIR"] == DEPLOYMENT["volumeMounts"][0]["mountPath"]
    assert DEPLOYMENT["codeServerArgs"] == ["-m", "hermes_assets.definitions"]
    assert VALUES["postgresql"]["postgresqlScheme"] == "postgresql+psycopg2"


def test_the_launcher_renders_each_run_as_a_job_whose_pod_runs_it(kube_api, s3_ledger, sim_url, isolated_homes,
                                                                    tmp_path, monkeypatch) -> None:
    home = isolated_homes / "dagster_home"
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": kube_api.url}}],
        "users": [{"name": "fake", "user": {"token": "t"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake", "namespace": NAMESPACE}}]}))
    (home / "dagster.yaml").write_text(yaml.safe_dump({
        "run_launcher": {"module": "dagster_k8s", "class": "K8sRunLauncher", "config": launcher_config(kubeconfig, home)},
        # Launch at once: in the cluster the daemon dequeues runs (QueuedRunCoordinator).
        "run_coordinator": {"module": "dagster._core.run_coordinator", "class": "DefaultRunCoordinator"},
        "concurrency": instance_concurrency(), "telemetry": {"enabled": False}}))
    # The cluster's paths and addresses, as seen from this machine: the data volume is the test's data
    # root, the bucket is moto's, the endpoint is the simulated model.
    here = {"HERMES_DATA_DIR": str(data_root()), "HERMES_LEDGER_URL": s3_ledger, "HERMES_BASE_URL": sim_url}
    data_root().mkdir(parents=True, exist_ok=True)
    dataset = data_root() / "d.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": f"Run a command that prints {i}"}) + "\n" for i in range(3)))
    assert batch_main([f"--dataset_file={dataset}", "--run_name=k8s", f"--base_url={sim_url}", "--api_key=k",
                       "--distribution=terminal_only",
                       "--batch_size=3", "--plan_only"]) == 0

    image = f"{DEPLOYMENT['image']['repository']}:{DEPLOYMENT['image']['tag']}"
    server_env = {**os.environ, **{e["name"]: e["value"] for e in DEPLOYMENT["env"]}, **here,
                  "DAGSTER_CONTAINER_IMAGE": image, "DAGSTER_CONTAINER_CONTEXT": json.dumps(container_context())}
    port = free_port()
    server = subprocess.Popen([DAGSTER, "code-server", "start", "-h", "127.0.0.1", "-p", str(port),
                               *DEPLOYMENT["codeServerArgs"]], cwd=ROOT, env=server_env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert wait_until(lambda: _answers(port), timeout=90), "the code server did not start"
    workspace = tmp_path / "workspace.yaml"
    workspace.write_text(yaml.safe_dump({"load_from": [{"grpc_server": {
        "host": "127.0.0.1", "port": port, "location_name": DEPLOYMENT["name"]}}]}))
    try:
        plan = run_as_pod(launch("k8s__plan_job", home, workspace=workspace), kube_api, here)
        assert plan.status == dg.DagsterRunStatus.SUCCESS, story(plan.run_id)
        job = kube_api.jobs[-1]
        model = as_model(job, "V1Job")
        container = model.spec.template.spec.containers[0]
        assert container.image == image and container.image_pull_policy == "IfNotPresent"
        assert container.args[:3] == ["dagster", "api", "execute_run"]
        assert {source.secret_ref.name for source in container.env_from if source.secret_ref} == {"hermes-foundry-secrets"}
        env = {e.name: e for e in container.env}
        assert env["HERMES_LEDGER_URL"].value == "s3://hermes-foundry-ledgers/ledgers"
        assert env["DAGSTER_PG_PASSWORD"].value_from.secret_key_ref.name == "hermes-foundry-postgresql"
        assert [(m.name, m.mount_path) for m in container.volume_mounts] == [("hermes-data", "/data/hermes")]
        assert container.security_context.capabilities.add == ["SYS_ADMIN"]
        assert container.resources.limits == {"memory": "8Gi"}
        assert model.spec.ttl_seconds_after_finished == 86400 and model.metadata.namespace in (None, NAMESPACE)

        batch_key = json.loads((data_root() / "k8s" / "batches.json").read_text())["batches"][0]["key"]
        batch = run_as_pod(launch("k8s__batch_job", home, {"dagster/partition": batch_key}, workspace), kube_api, here)
        assert batch.status == dg.DagsterRunStatus.SUCCESS, story(batch.run_id)
        assert len(kube_api.jobs) == 2 and kube_api.other_requests == []
        records = ObjectLedger(f"{s3_ledger}/k8s").latest  # the pod recorded its samples in the bucket
        assert len(records) == 3 and {r["dagster_run_id"] for r in records.values()} == {batch.run_id}
        assert all(r["disposition"] == "kept" for r in records.values())
        assert not (data_root() / "k8s" / "raw").exists()
    finally:
        server.terminate()
        server.wait(timeout=30)



def _answers(port: int) -> bool:
    done = subprocess.run([DAGSTER, "api", "grpc-health-check", "-p", str(port)], capture_output=True)
    return done.returncode == 0


def run_as_pod(run_id: str, kube_api: FakeKubernetesAPI, here: dict[str, str]) -> dg.DagsterRun:
    """Do what the kubelet would with the newest Job: run its container's command with its env and
    the env of the Secrets it names (values from secret.example.yaml, then this machine's stand-ins)."""
    assert wait_until(lambda: any(j["metadata"]["labels"]["dagster/run-id"] == run_id for j in kube_api.jobs), timeout=30)
    [container] = kube_api.jobs[-1]["spec"]["template"]["spec"]["containers"]
    env = {"PATH": f"{BIN}:{os.environ['PATH']}", "HOME": os.environ.get("HOME", "/root")}
    for source in container.get("envFrom", []):
        env.update(secrets()[source["secretRef"]["name"]])
    env.update({e["name"]: e["value"] for e in container["env"] if "value" in e})
    env.update({**CREDENTIALS, **here, "FSSPEC_S3_ENDPOINT_URL": os.environ["FSSPEC_S3_ENDPOINT_URL"],
                "HERMES_API_KEY": "k"})
    done = subprocess.run([*container.get("command", []), *container["args"]], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return wait_for(run_id)
