"""Self-signed development certificates for MoQT over raw QUIC.

QUIC always runs TLS 1.3, so even a test cluster needs a certificate. One file,
cert.pem, is both the server's certificate chain and the CA file a client
trusts, which keeps certificate verification ON everywhere (no `insecure` flag
in normal use) without running a PKI. EC P-256 because every QUIC stack
(aioquic, qh3, moq-rs/rustls, browsers) accepts it and it signs fast.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEFAULT_HOSTS: tuple[str, ...] = ("localhost", "127.0.0.1", "::1")
"""Names every dev certificate covers, so local tests and demos verify out of the box."""

MAX_VALIDITY_DAYS = 825
"""The longest validity TLS clients accept for a leaf (CA/Browser Forum limit)."""

CERT_FILE = "cert.pem"
KEY_FILE = "key.pem"


class CertificateError(ValueError):
    """A certificate request that cannot be honoured (bad host name, bad validity)."""


@dataclass(frozen=True, slots=True)
class CertificatePaths:
    """Where a certificate and its key were written; `cert` is also the CA file to trust."""

    cert: Path
    key: Path


def _subject_alt_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        pass
    if not host or len(host) > 253 or any(c.isspace() or c in "/\\@" for c in host):
        raise CertificateError(f"not a host name or IP address: {host!r}")
    return x509.DNSName(host)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _key_usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def generate_certificate(hosts: Iterable[str] = (), *, days: int = 30) -> tuple[bytes, bytes]:
    """Return (certificate chain PEM, private key PEM) for DEFAULT_HOSTS plus `hosts`.

    The chain is a leaf followed by the throwaway CA that signed it. webpki-style
    verifiers (qh3, rustls/moq-rs) refuse a CA certificate as the server's own
    certificate, so one self-signed cert cannot serve both roles; a chain file
    can: loaded as the server's chain it presents leaf + CA, loaded as a CA file
    it yields the CA as trust anchor. The CA key is never written, so the file
    cannot be used to mint certificates for other names.
    """
    if not 1 <= days <= MAX_VALIDITY_DAYS:
        raise CertificateError(f"validity must be 1..{MAX_VALIDITY_DAYS} days, got {days}")
    names = list(dict.fromkeys([*DEFAULT_HOSTS, *hosts]))
    alt_names = [_subject_alt_name(name) for name in names]
    now = datetime.datetime.now(datetime.UTC)
    not_before = now - datetime.timedelta(minutes=5)
    not_after = now + datetime.timedelta(days=days)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("kvmoq dev CA")
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )

    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(_name(names[-1]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    chain_pem = b"".join(c.public_bytes(serialization.Encoding.PEM) for c in (leaf, ca_cert))
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return chain_pem, key_pem


def write_certificate(
    out_dir: Path, hosts: Iterable[str] = (), *, days: int = 30, overwrite: bool = False
) -> CertificatePaths:
    """Write cert.pem and key.pem into `out_dir`; the key is created owner-only (0600)."""
    cert_pem, key_pem = generate_certificate(hosts, days=days)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = CertificatePaths(cert=out_dir / CERT_FILE, key=out_dir / KEY_FILE)
    if not overwrite:
        existing = [str(p) for p in (paths.cert, paths.key) if p.exists()]
        if existing:
            raise FileExistsError(f"refusing to overwrite {', '.join(existing)}")
    # Open with 0600 from the start: a chmod after writing leaves a window where the key is readable.
    fd = os.open(paths.key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as key_file:
        key_file.write(key_pem)
    paths.cert.write_bytes(cert_pem)
    return paths
