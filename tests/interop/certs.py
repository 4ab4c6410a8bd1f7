"""A throwaway CA and a leaf certificate for 127.0.0.1 / localhost, made per test session.

A CA plus a leaf, not one self-signed certificate: rustls (moq-rs) rejects a CA certificate
presented as a server's end-entity certificate, and picoquic (aiomoqt) and aioquic verify a
chain against a CA file. Every peer is told to trust ca.pem; nothing skips verification.

Keep the directory for certificates only: moq-rs watches the directory of its certificate
files and reloads on every change in it, so a log file written there makes it reload in a
loop (about 30 000 reloads a second at log level info).
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=2)


@dataclass(frozen=True)
class Certs:
    """Paths of the PEM files a relay serves with (cert, key) and clients trust (ca)."""

    ca: Path
    cert: Path
    key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(
    subject: str, issuer: str, public_key: ec.EllipticCurvePublicKey, ca: bool
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )


def _pem(certificate: x509.Certificate) -> bytes:
    return certificate.public_bytes(serialization.Encoding.PEM)


def make_certs(directory: Path) -> Certs:
    """Write ca.pem, cert.pem and key.pem into `directory` (created if needed)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        _builder("kvmoq interop test CA", "kvmoq interop test CA", ca_key.public_key(), ca=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    leaf_cert = (
        _builder("localhost", "kvmoq interop test CA", leaf_key.public_key(), ca=False)
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    certs = Certs(ca=directory / "ca.pem", cert=directory / "cert.pem", key=directory / "key.pem")
    certs.ca.write_bytes(_pem(ca_cert))
    certs.cert.write_bytes(_pem(leaf_cert))
    certs.key.write_bytes(
        leaf_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return certs
