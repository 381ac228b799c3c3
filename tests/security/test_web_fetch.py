"""web_fetch and skills' http tools reach only public addresses, and exactly the address they checked.

The attacks go through the real gRPC server: web_fetch through ExecuteTool, a skill's http tool
through LoadSkill and Generate. Real HTTP servers listen on 127.0.0.x; a few tests stand in for
DNS by replacing the resolver function of this process (there is no DNS server here), and the
namespace tests run a real DNS server and a "public" site at 1.2.3.4 in a private network
namespace (tests/security/netns_scenario.py), where redirects and DNS rebinding are real.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.testing.fake_llm import FakeLLM, text, tool_call
from a3s_agent.tools.fetcher import refusal
from a3s_agent.tools.special_addresses import SPECIAL_BLOCKS, SpecialBlock, special_block

from ..conftest import LiveServer, new_session, user
from . import netns_scenario as scenario
from .sites import Site

pytestmark = pytest.mark.security

REPO = Path(__file__).resolve().parents[2]
ALLOW_PRIVATE = {"A3S_FETCH_ALLOW_PRIVATE": "1"}
REFUSED = "only public addresses are fetched unless the server sets A3S_FETCH_ALLOW_PRIVATE=1"


# ---------------------------------------------------------------- helpers


@pytest.fixture
async def sentinel() -> AsyncIterator[tuple[Site, int]]:
    """The internal service an attacker wants to reach, on 127.0.0.1."""
    site = Site("INTERNAL-SECRET")
    port = await site.start("127.0.0.1", 0)
    yield site, port
    await site.stop()


class Resolver:
    """Stands in for DNS in this process: made-up names get the answers set here, every other
    name goes to the real resolver. `answers[name](asked)` is the address for the name's
    question number `asked` (0, 1...); `calls[name]` counts the questions."""

    def __init__(self) -> None:
        self.answers: dict[str, Callable[[int], str]] = {}
        self.calls: dict[str, int] = {}


@pytest.fixture
def resolver(monkeypatch: pytest.MonkeyPatch) -> Resolver:
    fake = Resolver()
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        name = host.decode() if isinstance(host, bytes) else host
        if name not in fake.answers:
            return real(host, port, *args, **kwargs)
        asked = fake.calls.get(name, 0)
        fake.calls[name] = asked + 1
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (fake.answers[name](asked), port or 0))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return fake


async def execute(server: LiveServer, tool: str, **arguments: Any) -> pb.ToolResult:
    reply = await server.stub.ExecuteTool(
        pb.ExecuteToolRequest(tool_name=tool, arguments=json.dumps(arguments))
    )
    return reply.result


@pytest.fixture(autouse=True)
def _private_not_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("A3S_FETCH_ALLOW_PRIVATE", raising=False)


# ---------------------------------------------------------------- pinning


async def test_the_connection_goes_to_the_address_that_was_checked(
    live: LiveServer, resolver: Resolver
) -> None:
    """DNS rebinding: the name resolves to one address at the check, another right after."""
    checked, rebound = Site("the checked address"), Site("the rebound address")
    port = await checked.start("127.0.0.1", 0)
    await rebound.start("127.0.0.2", port)
    resolver.answers["rebind.test"] = lambda asked: "127.0.0.1" if asked == 0 else "127.0.0.2"
    try:
        # Private addresses are allowed here (both sites are on loopback): only the pinning is tested.
        await live.stub.Initialize(pb.InitializeRequest(env=ALLOW_PRIVATE))
        result = await execute(live, "web_fetch", url=f"http://rebind.test:{port}/page")
    finally:
        await checked.stop()
        await rebound.stop()
    assert result.success, result.error
    assert result.output == "the checked address"
    assert rebound.requests == []
    assert [(hit["path"], hit["host"]) for hit in checked.requests] == [("/page", f"rebind.test:{port}")]
    assert resolver.calls["rebind.test"] == 1


def _certificate(tmp_path: Path, name: str) -> tuple[Path, ssl.SSLContext]:
    """A CA file, and a server context with a certificate for `name` signed by that CA."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "a3s test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(1)
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(2)
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    ca_file, cert_file, key_file = tmp_path / "ca.pem", tmp_path / "cert.pem", tmp_path / "key.pem"
    ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_file.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_file, key_file)
    return ca_file, context


async def test_tls_to_the_checked_address_still_verifies_the_host_name(
    live: LiveServer, resolver: Resolver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca_file, context = _certificate(tmp_path, "pinned.test")
    monkeypatch.setenv("SSL_CERT_FILE", str(ca_file))
    site = Site("over TLS")
    port = await site.start("127.0.0.1", 0, tls=context)
    resolver.answers["pinned.test"] = resolver.answers["impostor.test"] = lambda asked: "127.0.0.1"
    try:
        await live.stub.Initialize(pb.InitializeRequest(env=ALLOW_PRIVATE))
        good = await execute(live, "web_fetch", url=f"https://pinned.test:{port}/")
        wrong_name = await execute(live, "web_fetch", url=f"https://impostor.test:{port}/")
    finally:
        await site.stop()
    assert good.success, good.error
    assert good.output == "over TLS"
    assert [(hit["path"], hit["host"]) for hit in site.requests] == [("/", f"pinned.test:{port}")]
    # The TLS server name sent was the host name, not the address dialled.
    assert site.server_names == ["pinned.test", "impostor.test"]
    assert not wrong_name.success
    assert "certificate verify failed" in wrong_name.error and "impostor.test" in wrong_name.error


# ---------------------------------------------------------------- address forms


REFUSED_URLS = [
    ("http://127.0.0.1:{port}/", "127.0.0.1 is a loopback address"),
    ("http://localhost:{port}/", "localhost resolves to 127.0.0.1, a loopback address"),
    ("http://2130706433:{port}/", "2130706433 resolves to 127.0.0.1, a loopback address"),
    ("http://0x7f.1:{port}/", "0x7f.1 resolves to 127.0.0.1, a loopback address"),
    ("http://017700000001:{port}/", "017700000001 resolves to 127.0.0.1, a loopback address"),
    ("http://127.1:{port}/", "127.1 resolves to 127.0.0.1, a loopback address"),
    ("http://0.0.0.0:{port}/", "0.0.0.0 is the unspecified address"),
    ("http://[::]:{port}/", ":: is the unspecified address"),
    ("http://[::1]:{port}/", "::1 is a loopback address"),
    ("http://[::ffff:127.0.0.1]:{port}/", "::ffff:127.0.0.1 is a loopback address (127.0.0.1) inside"),
    ("http://[::127.0.0.1]:{port}/", "::127.0.0.1 is a loopback address (127.0.0.1) inside"),
    ("http://[::ffff:0:127.0.0.1]:{port}/", "::ffff:0:127.0.0.1 is a loopback address (127.0.0.1) inside"),
    ("http://[64:ff9b::127.0.0.1]:{port}/", "64:ff9b::127.0.0.1 is a loopback address (127.0.0.1) inside"),
    (
        "http://[64:ff9b::10.0.0.1]/",
        "64:ff9b::10.0.0.1 is a special-purpose address (IANA: 10.0.0.0/8, Private-Use) (10.0.0.1) inside",
    ),
    ("http://[64:ff9b:1::808:808]/", "64:ff9b:1::808:808 is a special-purpose address (IANA: 64:ff9b:1::/48"),
    ("http://[2002:7f00:1::1]/", "2002:7f00:1::1 is a loopback address (127.0.0.1) inside"),
    ("http://[2002:a9fe:a9fe::1]/", "2002:a9fe:a9fe::1 is a link-local address (169.254.169.254) inside"),
    ("http://[2001:0:4136:e378:8000:63bf:80ff:fffe]/", "is a loopback address (127.0.0.1) inside"),
    ("http://169.254.169.254/latest/meta-data/", "169.254.169.254 is a link-local address"),
    ("http://10.1.2.3/", "10.1.2.3 is a special-purpose address (IANA: 10.0.0.0/8, Private-Use)"),
    ("http://192.168.1.1/", "192.168.1.1 is a special-purpose address (IANA: 192.168.0.0/16"),
    ("http://172.16.0.1/", "172.16.0.1 is a special-purpose address (IANA: 172.16.0.0/12"),
    (
        "http://100.64.0.1/",
        "100.64.0.1 is a special-purpose address (IANA: 100.64.0.0/10, Shared Address Space)",
    ),
    ("http://224.0.0.1/", "224.0.0.1 is a multicast address"),
    ("http://239.255.255.250/", "239.255.255.250 is a multicast address"),
    ("http://192.0.2.1/", "(IANA: 192.0.2.0/24, Documentation (TEST-NET-1))"),
    ("http://198.18.0.1/", "(IANA: 198.18.0.0/15, Benchmarking)"),
    ("http://240.0.0.1/", "(IANA: 240.0.0.0/4, Reserved)"),
    ("http://255.255.255.255/", "255.255.255.255 is a"),
    ("http://[fe80::1]/", "fe80::1 is a link-local address"),
    ("http://[fc00::1]/", "fc00::1 is a special-purpose address (IANA: fc00::/7, Unique-Local)"),
    ("http://[fd12:3456::1]/", "(IANA: fc00::/7, Unique-Local)"),
    ("http://[fec0::1]/", "fec0::1 is a site-local address"),
    ("http://[ff02::1]/", "ff02::1 is a multicast address"),
    ("http://[ff0e::1]/", "ff0e::1 is a multicast address"),
    ("http://[2001:db8::1]/", "(IANA: 2001:db8::/32, Documentation)"),
    # What Python 3.11's ipaddress tables call global, and IANA's registries do not.
    ("http://192.0.0.8/", "(IANA: 192.0.0.8/32, IPv4 dummy address)"),
    ("http://192.0.0.170/", "(IANA: 192.0.0.170/32, NAT64/DNS64 Discovery)"),
    ("http://192.0.0.200/", "(IANA: 192.0.0.0/24, IETF Protocol Assignments)"),
    ("http://192.88.99.1/", "(IANA: 192.88.99.0/24, Deprecated (6to4 Relay Anycast))"),
    ("http://192.88.99.2/", "(IANA: 192.88.99.2/32, 6a44-relay anycast address)"),
    ("http://[3fff::1]/", "(IANA: 3fff::/20, Documentation)"),
    ("http://[3fff:fff::1]/", "(IANA: 3fff::/20, Documentation)"),
    ("http://[5f00::1]/", "(IANA: 5f00::/16, Segment Routing (SRv6) SIDs)"),
    ("http://[100:0:0:1::1]/", "(IANA: 100:0:0:1::/64, Dummy IPv6 Prefix)"),
    ("http://[2001:10::1]/", "(IANA: 2001:10::/28, Deprecated (previously ORCHID))"),
    ("http://[4000::1]/", "4000::1 is a reserved address"),
]


@pytest.mark.parametrize(("template", "words"), REFUSED_URLS)
async def test_web_fetch_refuses_every_form_of_a_non_public_address(
    live: LiveServer, sentinel: tuple[Site, int], template: str, words: str
) -> None:
    site, port = sentinel
    result = await execute(live, "web_fetch", url=template.format(port=port))
    assert not result.success
    assert words in result.error and result.error.endswith(REFUSED)
    assert site.requests == []


@pytest.mark.parametrize("address", ["::ffff:8.8.8.8", "64:ff9b::8.8.8.8", "2002:808:808::1", "::8.8.8.8"])
def test_an_ipv6_address_carrying_a_public_ipv4_address_is_public(address: str) -> None:
    """The other side of the rules above (checked without fetching: there is no internet here)."""
    assert refusal(ipaddress.ip_address(address)) is None


@pytest.mark.parametrize(
    "address",
    ["8.8.8.8", "192.0.0.9", "192.0.0.10", "192.31.196.1", "192.52.193.255", "192.175.48.1", "2606:4700::1",
     "2001:1::1", "2001:1::3", "2001:3::1", "2001:4:112::1", "2001:20::1", "2001:30::1", "2620:4f:8000::1"],
)  # fmt: skip
def test_blocks_the_registries_call_globally_reachable_are_public(address: str) -> None:
    assert refusal(ipaddress.ip_address(address)) is None


# Rows whose addresses carry an IPv4 address, which decides (above), whatever the row says.
_CARRIERS = {"::ffff:0:0/96", "64:ff9b::/96", "2001::/32", "2002::/16"}


@pytest.mark.parametrize(
    "block", [b for b in SPECIAL_BLOCKS if str(b.network) not in _CARRIERS], ids=lambda b: str(b.network)
)
def test_every_registry_row_decides_its_first_and_last_address(block: SpecialBlock) -> None:
    """Each row of IANA's two special-purpose registries (tools/special_addresses.py): its
    addresses are public exactly when the row says globally reachable, except where a more
    specific row says otherwise."""
    own = [a for a in (block.network[0], block.network[-1]) if special_block(a) == block]
    assert own, "neither end of the block is the row's own"
    for address in own:
        assert (refusal(address) is None) == (block.globally_reachable is True), address


# ---------------------------------------------------------------- the skill http backend

SKILL = """---
name: internal-reader
description: Reads a URL.
tools:
  - name: read_host
    parameters: {type: object, properties: {host: {type: string}}, required: [host]}
    http: "http://${host}:PORT/secret"
---
Read with read_host.
"""


async def test_a_skill_http_tool_is_held_to_the_same_rules(
    agent: LiveServer, fake: FakeLLM, sentinel: tuple[Site, int], resolver: Resolver
) -> None:
    site, port = sentinel
    resolver.answers["sneaky.test"] = lambda asked: "127.0.0.1"
    session_id = await new_session(agent)
    skill = SKILL.replace("PORT", str(port))
    await agent.stub.LoadSkill(pb.LoadSkillRequest(session_id=session_id, skill_content=skill))
    errors = []
    for host in ("127.0.0.1", "2130706433", "sneaky.test", "localhost"):
        fake.script(tool_call("read_host", {"host": host}), text("done"))
        reply = await agent.stub.Generate(pb.GenerateRequest(session_id=session_id, messages=[user("go")]))
        called = reply.tool_calls[0].result
        assert not called.success
        errors.append(called.error)
    template = f"http://${{host}}:{port}/secret"
    assert errors == [
        f"GET {template} failed: 127.0.0.1 is a loopback address: {REFUSED}",
        f"GET {template} failed: 2130706433 resolves to 127.0.0.1, a loopback address: {REFUSED}",
        f"GET {template} failed: sneaky.test resolves to 127.0.0.1, a loopback address: {REFUSED}",
        f"GET {template} failed: localhost resolves to 127.0.0.1, a loopback address: {REFUSED}",
    ]
    assert site.requests == []


# ---------------------------------------------------------------- a private network namespace


@pytest.fixture(scope="module")
def namespace(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """What netns_scenario's attacks returned, run in a private network and mount namespace."""
    tools = all(shutil.which(name) for name in ("unshare", "ip", "mount"))
    if not tools or subprocess.run(["unshare", "-n", "-m", "true"], capture_output=True).returncode:
        pytest.skip("a private network namespace needs unshare, ip and mount, and the right to use them")
    directory = tmp_path_factory.mktemp("netns")
    resolv, out = directory / "resolv.conf", directory / "results.json"
    resolv.write_text("nameserver 127.0.0.1\noptions timeout:2 attempts:1\n")
    script = (
        f"mount --bind {resolv} /etc/resolv.conf && ip link set lo up && "
        f'ip addr add {scenario.PUBLIC}/32 dev lo && exec "$0" -m tests.security.netns_scenario "$1"'
    )
    env = {name: value for name, value in os.environ.items() if name != "A3S_FETCH_ALLOW_PRIVATE"}
    done = subprocess.run(
        ["unshare", "-n", "-m", "sh", "-c", script, sys.executable, str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    yield json.loads(out.read_text())


def test_the_public_site_is_reachable_by_name_and_address(namespace: dict[str, Any]) -> None:
    """The control: the refusals below are of the addresses, not of a network that does not work."""
    for result in (
        namespace["web_fetch"]["control"],
        namespace["web_fetch"]["control_by_address"],
        namespace["skill"]["control"],
    ):
        assert result["success"], result["error"]
        assert scenario.PUBLIC_PAGE in result["output"]


@pytest.mark.parametrize(
    ("case", "words"),
    [
        ("redirect_to_loopback", "127.0.0.1 is a loopback address"),
        ("redirect_to_decimal", "2130706433 resolves to 127.0.0.1, a loopback address"),
        ("redirect_to_mapped", "is a loopback address (127.0.0.1) inside an IPv6 address"),
        ("redirect_to_name", "internal.test resolves to 127.0.0.1, a loopback address"),
        ("name_of_loopback", "internal.test resolves to 127.0.0.1, a loopback address"),
    ],
)
def test_web_fetch_from_a_public_site_to_the_internal_service_is_refused(
    namespace: dict[str, Any], case: str, words: str
) -> None:
    result = namespace["web_fetch"][case]
    assert not result["success"]
    assert result["error"].endswith(f"{words}: {REFUSED}")


@pytest.mark.parametrize(
    ("case", "words"),
    [
        ("redirect_to_loopback", "127.0.0.1 is a loopback address"),
        ("name_of_loopback", "internal.test resolves to 127.0.0.1, a loopback address"),
    ],
)
def test_a_skill_http_tool_from_a_public_site_to_the_internal_service_is_refused(
    namespace: dict[str, Any], case: str, words: str
) -> None:
    result = namespace["skill"][case]
    assert not result["success"]
    assert result["error"].endswith(f"failed: {words}: {REFUSED}")


def test_dns_rebinding_reaches_only_the_checked_public_address(namespace: dict[str, Any]) -> None:
    for result in (namespace["web_fetch"]["rebinding"], namespace["skill"]["rebinding"]):
        assert result["success"], result["error"]
        assert result["output"].endswith(scenario.PUBLIC_PAGE)
    assert namespace["rebind_a_queries"] == 1


def test_the_internal_service_was_never_reached(namespace: dict[str, Any]) -> None:
    assert namespace["internal_hits"] == []
