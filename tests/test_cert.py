"""`kvmoq cert` as an operator uses it, and its certificate in real QUIC handshakes."""

from __future__ import annotations

import asyncio
import ipaddress
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509

from sidecar.address import free_udp_port
from sidecar.moqt.aio.quic_backend import QuicSettings, load_backend
from sidecar.moqt.aio.tls import (
    CertificateError,
    CertificatePaths,
    generate_certificate,
    write_certificate,
)
from tests.support.relay import STACKS


def run_cert(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sidecar.cli", "cert", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def make_cert(tmp_path: Path, name: str) -> CertificatePaths:
    # In-process: the CLI has its own tests here, and each `kvmoq` start costs seconds.
    return write_certificate(tmp_path / name)


def test_cert_writes_chain_and_private_key(tmp_path: Path) -> None:
    result = run_cert(
        "--out", str(tmp_path), "--host", "relay.example.internal", "--host", "10.1.2.3"
    )
    assert result.returncode == 0, result.stderr
    chain = x509.load_pem_x509_certificates((tmp_path / "cert.pem").read_bytes())
    assert len(chain) == 2
    leaf, ca = chain
    assert leaf.issuer == ca.subject
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(san.get_values_for_type(x509.DNSName)) == {"localhost", "relay.example.internal"}
    assert set(san.get_values_for_type(x509.IPAddress)) == {
        ipaddress.ip_address(a) for a in ("127.0.0.1", "::1", "10.1.2.3")
    }
    assert (tmp_path / "key.pem").stat().st_mode & 0o777 == 0o600
    assert b"PRIVATE KEY" in (tmp_path / "key.pem").read_bytes()
    assert b"PRIVATE KEY" not in (tmp_path / "cert.pem").read_bytes()


def test_cert_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    assert run_cert("--out", str(tmp_path)).returncode == 0
    first = (tmp_path / "cert.pem").read_bytes()
    again = run_cert("--out", str(tmp_path))
    assert again.returncode == 2
    assert "refusing to overwrite" in again.stdout
    assert (tmp_path / "cert.pem").read_bytes() == first
    assert run_cert("--out", str(tmp_path), "--force").returncode == 0
    assert (tmp_path / "cert.pem").read_bytes() != first


def test_cert_rejects_bad_host_and_validity(tmp_path: Path) -> None:
    bad_host = run_cert("--out", str(tmp_path), "--host", "a b")
    assert bad_host.returncode == 2
    assert "not a host name" in bad_host.stdout
    assert run_cert("--out", str(tmp_path), "--days", "0").returncode == 2
    assert not (tmp_path / "key.pem").exists()
    with pytest.raises(CertificateError):
        generate_certificate(days=10_000)


def test_cert_help_explains_files() -> None:
    result = run_cert("--help")
    assert result.returncode == 0
    assert "cert.pem" in result.stdout and "key.pem" in result.stdout


async def handshake(backend_name: str, server: CertificatePaths, ca: Path, host: str) -> None:
    """One QUIC handshake against a server holding `server`, trusting only `ca`."""
    backend = load_backend(backend_name)  # type: ignore[arg-type]
    settings = QuicSettings(backend=backend_name, ca_file=ca)  # type: ignore[arg-type]
    port = free_udp_port()
    quic_server = await backend.serve(
        "127.0.0.1",
        port,
        configuration=backend.configuration(
            settings, is_client=False, cert=server.cert, key=server.key
        ),
    )
    try:
        config = backend.configuration(settings, is_client=True, server_name=host)
        async with backend.connect("127.0.0.1", port, configuration=config) as client:
            await client.ping()
    finally:
        quic_server.close()


@pytest.mark.parametrize("backend", STACKS)
@pytest.mark.parametrize("host", ["localhost", "127.0.0.1"])
def test_client_trusting_the_cert_connects(tmp_path: Path, backend: str, host: str) -> None:
    paths = make_cert(tmp_path, "server")
    asyncio.run(asyncio.wait_for(handshake(backend, paths, paths.cert, host), 20))


@pytest.mark.parametrize("backend", STACKS)
def test_client_trusting_another_ca_is_refused(tmp_path: Path, backend: str) -> None:
    paths = make_cert(tmp_path, "server")
    other = make_cert(tmp_path, "other")
    with pytest.raises(ConnectionError):
        asyncio.run(asyncio.wait_for(handshake(backend, paths, other.cert, "localhost"), 20))


@pytest.mark.parametrize("backend", STACKS)
def test_name_outside_the_cert_is_refused(tmp_path: Path, backend: str) -> None:
    paths = make_cert(tmp_path, "server")
    with pytest.raises(ConnectionError):
        asyncio.run(asyncio.wait_for(handshake(backend, paths, paths.cert, "evil.example"), 20))
