"""The deployment examples, deploy/compose.yaml and deploy/kubernetes.yaml, checked for what an operator
would break. Each replica's environment, built as its container sees it (the image's ENV, then the
file's), passes the server's own start-up checks and points at the database; the token comes from a
secret; the probes ask /health/ready on the port the HTTP face listens on; every replica mounts the same
workspace; the ports line up. Then the compose replicas really serve, two processes on one PostgreSQL
(tests/postgres.py), ready by the file's own health check. `docker compose config` and `kubectl apply
--dry-run=client` run too where they can."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from a3s_agent.config import ConfigError, Settings, check_serving, exposed_listeners, settings_from
from a3s_agent.faces.http.auth import HTTP_OPEN_PATHS
from a3s_agent.faces.http.hosts import HostPolicy

from .conftest import free_port
from .test_container import ROOT, _dockerfile, _dockerfile_env

DEPLOY = ROOT / "deploy"
COMPOSE = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
K8S = {doc["kind"]: doc for doc in yaml.safe_load_all((DEPLOY / "kubernetes.yaml").read_text())}
DEPLOYMENT = K8S["Deployment"]
POD = DEPLOYMENT["spec"]["template"]
CONTAINER = POD["spec"]["containers"][0]
NAMESPACE = "agents"
POD_NAME = f"{DEPLOYMENT['metadata']['name']}-5d8f7c9b6d-x7k2p"  # a Deployment's pod: name-hash-suffix
TOKEN = "tok-deploy-test"
WIND_DOWN_S = 6  # README: a whole stop takes at most the grace period plus about 6 s
USER = re.search(r"useradd --create-home --uid (\d+) (\w+)", _dockerfile())
assert USER, "the Dockerfile creates the image's user"
IMAGE_UID, IMAGE_HOME = int(USER[1]), f"/home/{USER[2]}"


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def _exposed() -> set[int]:
    match = re.search(r"^EXPOSE (.+)$", _dockerfile(), re.MULTILINE)
    assert match, "the Dockerfile exposes its ports"
    return {int(port) for port in match[1].split()}


def _seconds(duration: str) -> float:
    match = re.fullmatch(r"(\d+)s", duration)
    assert match, f"{duration!r}: write Compose durations in seconds here"
    return float(match[1])


# --- compose ----------------------------------------------------------------------------------------

_VARIABLE = re.compile(r"\$\{(\w+)(?::([-?])([^}]*))?\}")


def _interpolate(value: str, dotenv: dict[str, str]) -> str:
    """Compose's ${VAR}, ${VAR:-default} and ${VAR:?error}: unset or empty gives the default or the error."""

    def one(match: re.Match[str]) -> str:
        name, kind, argument = match.groups()
        if dotenv.get(name):
            return dotenv[name]
        if kind == "?":
            raise ValueError(f"{name}: {argument}")
        return argument if kind == "-" else ""

    return _VARIABLE.sub(one, value)


def _env_example() -> dict[str, str]:
    lines = (DEPLOY / "env.example").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


FILLED = {**_env_example(), "A3S_AUTH_TOKEN": TOKEN, "POSTGRES_PASSWORD": "pw-deploy-test"}  # deploy/.env


def _replicas() -> dict[str, dict[str, Any]]:
    """The services built from this repository's Dockerfile."""
    return {name: service for name, service in COMPOSE["services"].items() if "build" in service}


def _compose_env(service: dict[str, Any], dotenv: dict[str, str], secrets_dir: Path) -> dict[str, str]:
    """The environment the service's container starts with: the image's ENV, then the service's
    (interpolated from deploy/.env), with each secret written under secrets_dir and the variables that
    name its container path pointed there instead."""
    env = {
        **_dockerfile_env(),
        **{k: _interpolate(str(v), dotenv) for k, v in service["environment"].items()},
    }
    for grant in service.get("secrets", []):
        path = secrets_dir / grant["source"]
        path.write_text(dotenv[COMPOSE["secrets"][grant["source"]]["environment"]])
        env = {name: str(path) if value == grant["target"] else value for name, value in env.items()}
    return env


def _compose_settings(service: dict[str, Any], secrets_dir: Path) -> Settings:
    return settings_from(env=_compose_env(service, FILLED, secrets_dir))


def _mounts(service: dict[str, Any]) -> dict[str, str]:
    """Container path -> named volume (short syntax `volume:path`)."""
    return {entry.split(":")[1]: entry.split(":")[0] for entry in service["volumes"]}


def test_compose_runs_replicas_of_the_image_on_one_database_with_a_token(tmp_path: Path) -> None:
    postgres = COMPOSE["services"]["postgres"]
    assert postgres["image"].startswith("postgres:")  # the official image
    password_grant = postgres["secrets"][0]
    assert postgres["environment"]["POSTGRES_PASSWORD_FILE"] == password_grant["target"]
    password = FILLED[COMPOSE["secrets"][password_grant["source"]]["environment"]]
    replicas = _replicas()
    assert len(replicas) >= 2
    replica_ids = set()
    for service in replicas.values():
        assert (DEPLOY / service["build"]["context"]).resolve() == ROOT and (ROOT / "Dockerfile").exists()
        assert service["depends_on"]["postgres"]["condition"] == "service_healthy"
        settings = _compose_settings(service, tmp_path)
        check_serving(settings)  # what `serve` checks before it starts
        assert settings.auth_token == TOKEN
        assert len(exposed_listeners(settings)) == 2  # both listeners face the compose network
        store = urlsplit(settings.store)
        assert (store.scheme, store.hostname, store.port, store.path) == (
            "postgresql",
            "postgres",
            5432,
            "/" + postgres["environment"]["POSTGRES_DB"],
        )
        assert (store.username, store.password) == (postgres["environment"]["POSTGRES_USER"], password)
        replica_ids.add(settings.replica_id)
    assert len(replica_ids) == len(replicas)  # leases and logs tell the replicas apart


def test_compose_token_is_a_secret_file_the_image_user_can_read(tmp_path: Path) -> None:
    for service in _replicas().values():
        assert "A3S_AUTH_TOKEN" not in service["environment"]  # `docker inspect` would show it
        grants = {grant["target"]: grant for grant in service["secrets"]}
        grant = grants[service["environment"]["A3S_AUTH_TOKEN_FILE"]]
        # YAML 1.2, which Compose reads: 0o400 is octal, 0400 would be decimal 400.
        assert str(grant["mode"]).startswith("0o") and int(grant["mode"][2:], 8) & 0o400
        assert int(grant["uid"]) == IMAGE_UID
        for name, value in service["environment"].items():  # secrets come from deploy/.env, never the file
            if name.endswith(("_API_KEY", "_TOKEN", "_PASSWORD")):
                assert _VARIABLE.fullmatch(str(value)), name
        with pytest.raises(ConfigError, match="is empty"):  # deploy/.env without a token: exit 2
            settings_from(env=_compose_env(service, {**FILLED, "A3S_AUTH_TOKEN": ""}, tmp_path))


def test_compose_env_example_names_every_variable_and_holds_no_secret() -> None:
    example = _env_example()
    needed = {match[0] for match in _VARIABLE.findall(json.dumps(COMPOSE))}
    needed |= {secret["environment"] for secret in COMPOSE["secrets"].values()}
    assert needed <= set(example), needed - set(example)
    assert example["A3S_AUTH_TOKEN"] == example["POSTGRES_PASSWORD"] == example["A3S_LLM_API_KEY"] == ""
    ignored = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", "deploy/.env"], check=False)
    assert ignored.returncode == 0, "git must ignore deploy/.env, the filled-in copy"


def test_compose_health_checks_ask_readiness_on_the_http_port(tmp_path: Path) -> None:
    for service in _replicas().values():
        settings = _compose_settings(service, tmp_path)
        test = service["healthcheck"]["test"]
        assert test[0] == "CMD"
        url = re.search(r"http://127\.0\.0\.1:(\d+)(/[\w/]+)", " ".join(test))
        assert url and int(url[1]) == _port(settings.http_listen) and url[2] == "/health/ready"
        assert url[2] in HTTP_OPEN_PATHS  # the probe needs no token


def test_compose_replicas_share_the_workspace_and_not_the_data(tmp_path: Path) -> None:
    workspaces, data = [], []
    for service in _replicas().values():
        settings = _compose_settings(service, tmp_path)
        mounts = _mounts(service)
        workspaces.append(mounts[str(settings.workspace)])
        data.append(mounts[str(settings.resolved_data_dir)])
    assert len(set(workspaces)) == 1 and workspaces[0] in COMPOSE["volumes"]  # one named volume
    assert len(set(data)) == len(data) and set(data) <= set(COMPOSE["volumes"])


def test_compose_publishes_the_listeners_on_loopback_only(tmp_path: Path) -> None:
    host_ports = []
    for service in _replicas().values():
        settings = _compose_settings(service, tmp_path)
        published = [entry.split(":") for entry in service["ports"]]
        assert {ip for ip, _, _ in published} == {"127.0.0.1"}
        listening = {_port(settings.listen), _port(settings.http_listen)}
        assert {int(port) for _, _, port in published} == listening == _exposed()
        host_ports += [port for _, port, _ in published]
    assert len(set(host_ports)) == len(host_ports)
    assert "ports" not in COMPOSE["services"]["postgres"]


def test_compose_waits_for_a_graceful_stop(tmp_path: Path) -> None:
    for service in _replicas().values():
        settings = _compose_settings(service, tmp_path)
        assert _seconds(service["stop_grace_period"]) > settings.grace_seconds + WIND_DOWN_S


def test_compose_file_passes_docker_compose() -> None:
    docker = shutil.which("docker")
    if (
        docker is None
        or subprocess.run([docker, "compose", "version"], capture_output=True, check=False).returncode
    ):
        pytest.skip("docker compose is not installed here; the checks above read the file themselves")
    result = subprocess.run(
        [docker, "compose", "-f", str(DEPLOY / "compose.yaml"), "config", "--quiet"],
        env={**os.environ, **FILLED},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr


# --- kubernetes -------------------------------------------------------------------------------------


def _k8s_env(secret: dict[str, str]) -> dict[str, str]:
    """The container's environment as the kubelet builds it: the image's ENV, then the env list in
    order, secretKeyRef from `secret`, fieldRef from the pod, $(VAR) from earlier entries."""
    fields = {"metadata.name": POD_NAME, "metadata.namespace": NAMESPACE}
    defined: dict[str, str] = {}
    for entry in CONTAINER["env"]:
        source = entry.get("valueFrom")
        if source is None:
            defined[entry["name"]] = re.sub(r"\$\((\w+)\)", lambda m: defined.get(m[1], m[0]), entry["value"])
        elif "fieldRef" in source:
            defined[entry["name"]] = fields[source["fieldRef"]["fieldPath"]]
        else:
            ref = source["secretKeyRef"]
            assert ref["name"] == K8S["Secret"]["metadata"]["name"], "a Secret of this file"
            if ref["key"] in secret or not ref.get("optional"):
                defined[entry["name"]] = secret[ref["key"]]
    return {**_dockerfile_env(), **defined}


def _k8s_settings() -> Settings:
    """The settings of a pod whose Secret holds a token."""
    return settings_from(env=_k8s_env({**K8S["Secret"]["stringData"], "auth-token": TOKEN}))


def _container_port(reference: int | str) -> int:
    named = {port["name"]: port["containerPort"] for port in CONTAINER["ports"]}
    return named[reference] if isinstance(reference, str) else reference


def test_kubernetes_runs_replicas_on_one_database_with_the_token_from_the_secret() -> None:
    assert DEPLOYMENT["spec"]["replicas"] >= 2
    shipped = K8S["Secret"]["stringData"]
    with pytest.raises(ConfigError, match="without a token"):  # applied before the token is filled in
        check_serving(settings_from(env=_k8s_env(shipped)))
    settings = _k8s_settings()
    check_serving(settings)
    assert settings.auth_token == TOKEN and len(exposed_listeners(settings)) == 2
    assert settings.store == shipped["database-url"] and urlsplit(settings.store).scheme == "postgresql"
    assert settings.replica_id == POD_NAME  # the downward API's pod name, within the 64 characters
    by_name = {entry["name"]: entry for entry in CONTAINER["env"]}
    for name in ("A3S_AUTH_TOKEN", "A3S_STORE", "A3S_LLM_API_KEY"):  # never a literal in the Deployment
        assert "value" not in by_name[name] and "secretKeyRef" in by_name[name]["valueFrom"], name


def test_kubernetes_probes_ask_the_http_port_the_server_listens_on() -> None:
    settings = _k8s_settings()
    grpc_port, http_port = _port(settings.listen), _port(settings.http_listen)
    assert (
        {_container_port(port["name"]) for port in CONTAINER["ports"]} == {grpc_port, http_port} == _exposed()
    )
    for probe, path in (
        ("readinessProbe", "/health/ready"),
        ("livenessProbe", "/health/live"),
        ("startupProbe", "/health/live"),
    ):
        get = CONTAINER[probe]["httpGet"]
        assert (get["path"], _container_port(get["port"])) == (path, http_port), probe
        assert get.get("scheme", "HTTP") == "HTTP" and path in HTTP_OPEN_PATHS  # plain HTTP, no token


def test_kubernetes_service_reaches_both_listeners_of_the_pods() -> None:
    settings = _k8s_settings()
    service = K8S["Service"]["spec"]
    targets = {port["name"]: _container_port(port["targetPort"]) for port in service["ports"]}
    assert targets == {"grpc": _port(settings.listen), "http": _port(settings.http_listen)}
    labels = POD["metadata"]["labels"]
    for selector in (service["selector"], DEPLOYMENT["spec"]["selector"]["matchLabels"]):
        assert selector.items() <= labels.items()
    assert K8S["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_kubernetes_accepts_the_service_names_as_http_host() -> None:
    settings = _k8s_settings()
    policy = asyncio.run(
        HostPolicy.for_listener(settings.http_listen.rsplit(":", 1)[0], settings.allowed_hosts)
    )
    service, port = K8S["Service"]["metadata"]["name"], _port(settings.http_listen)
    for name in (service, f"{service}.{NAMESPACE}.svc", f"{service}.{NAMESPACE}.svc.cluster.local"):
        assert policy.allows(f"{name}:{port}", None), name
    assert not policy.allows(f"attacker.example:{port}", None)


def test_kubernetes_pods_share_the_workspace_claim_and_not_the_data() -> None:
    settings = _k8s_settings()
    mounts = {mount["mountPath"]: mount["name"] for mount in CONTAINER["volumeMounts"]}
    volumes = {volume["name"]: volume for volume in POD["spec"]["volumes"]}
    claim = volumes[mounts[str(settings.workspace)]]["persistentVolumeClaim"]["claimName"]
    pvc = K8S["PersistentVolumeClaim"]
    assert pvc["metadata"]["name"] == claim and "ReadWriteMany" in pvc["spec"]["accessModes"]
    assert "emptyDir" in volumes[mounts[str(settings.resolved_data_dir)]]  # each pod its own


def test_kubernetes_runs_as_the_image_user_on_a_read_only_root() -> None:
    settings = _k8s_settings()
    pod = POD["spec"]
    assert pod["securityContext"]["runAsUser"] == IMAGE_UID and pod["securityContext"]["runAsNonRoot"]
    assert pod["automountServiceAccountToken"] is False  # tools run commands in the pod
    container = CONTAINER["securityContext"]
    assert container["readOnlyRootFilesystem"] and not container["allowPrivilegeEscalation"]
    assert container["capabilities"]["drop"] == ["ALL"]
    writable = {mount["mountPath"] for mount in CONTAINER["volumeMounts"]}
    for path in (str(settings.workspace), str(settings.resolved_data_dir), "/tmp", IMAGE_HOME):
        assert path in writable, f"{path} must be writable on a read-only root"
    assert pod["terminationGracePeriodSeconds"] > settings.grace_seconds + WIND_DOWN_S


def test_kubernetes_file_passes_kubectl() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed here; the checks above read the file themselves")
    reach = subprocess.run(
        [kubectl, "version", "--request-timeout=5s"], capture_output=True, text=True, timeout=60, check=False
    )
    if reach.returncode:
        pytest.skip("kubectl has no cluster here, and its dry run needs the API server's schema")
    result = subprocess.run(
        [kubectl, "apply", "--dry-run=client", "--validate=strict", "-f", str(DEPLOY / "kubernetes.yaml")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr


# --- the compose replicas, served -------------------------------------------------------------------


def _call(port: int, method: str, path: str, body: dict[str, Any] | None = None, token: str = TOKEN) -> Any:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"authorization": f"Bearer {token}", "content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as reply:
        return json.loads(reply.read())


def _stopped(server: subprocess.Popen[str], grace_s: float) -> int | None:
    """The exit status within grace_s of SIGTERM, as the container runtime waits; None if it had to kill."""
    try:
        return server.wait(grace_s)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
        return None


def test_the_compose_replicas_serve_one_database(tmp_path: Path, postgres_url: str) -> None:
    """Each compose replica's environment with its container paths, ports and database moved onto this
    machine: both start, the file's health check says ready, and a session made on one is read on the
    other."""
    shared = tmp_path / "workspace"
    (shared / "project").mkdir(parents=True)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("A3S_", "OPENAI_")) and k != "WORKSPACE"}
    servers: list[tuple[subprocess.Popen[str], int, float]] = []
    try:
        for name, service in _replicas().items():
            env = _compose_env(service, FILLED, tmp_path)
            container_http = _port(env["A3S_HTTP_LISTEN"])
            http_port = free_port()
            env |= {
                "A3S_STORE": postgres_url,
                "WORKSPACE": str(shared),
                "A3S_DATA_DIR": str(tmp_path / name / "data"),
                "LISTEN_ADDR": f"0.0.0.0:{free_port()}",
                "A3S_HTTP_LISTEN": f"0.0.0.0:{http_port}",
            }
            check = [
                sys.executable if part == "python" else part.replace(f":{container_http}/", f":{http_port}/")
                for part in service["healthcheck"]["test"][1:]
            ]
            assert subprocess.run(check, capture_output=True, check=False).returncode, "nothing serves yet"
            log = tmp_path / f"{name}.log"
            with log.open("w") as output:
                server = subprocess.Popen(
                    [sys.executable, "-m", "a3s_agent", "serve"],
                    env={**base, **env},
                    cwd=shared,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
            servers.append((server, http_port, _seconds(service["stop_grace_period"])))
            deadline = time.monotonic() + 60
            while subprocess.run(check, capture_output=True, check=False).returncode:
                assert server.poll() is None, f"{name} exited: {log.read_text()}"
                assert time.monotonic() < deadline, f"{name} not ready in 60 s"
                time.sleep(0.3)
        (_, first, _), (_, second, _) = servers[:2]
        created = _call(first, "POST", "/sessions", {"config": {"workspace": str(shared / "project")}})
        session = _call(second, "GET", f"/sessions/{created['session_id']}")
        assert session["session"]["config"]["workspace"] == str(shared / "project")
        with pytest.raises(urllib.error.HTTPError) as refused:
            _call(second, "GET", "/sessions", token="not-the-token")
        assert refused.value.code == 401
    finally:
        for server, _, _ in servers:
            server.send_signal(signal.SIGTERM)
        stopped = [_stopped(server, grace_s) for server, _, grace_s in servers]
    assert stopped == [0] * len(servers)  # within the file's stop_grace_period
