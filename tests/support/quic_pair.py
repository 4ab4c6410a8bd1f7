"""Two real aioquic connections (client and server) joined in memory, each under a MoqtSession.

Datagrams are handed from one ``QuicConnection`` to the other on a simulated clock, as in
aioquic's own tests, so the sessions run over real QUIC and TLS without sockets.
"""

from __future__ import annotations

import datetime
import importlib
import ssl
import tempfile
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from sidecar.moqt.protocol.drafts import DRAFT_14, LEGACY_ALPN, Draft
from sidecar.moqt.protocol.events import MoqtEvent
from sidecar.moqt.protocol.session import MoqtSession, SessionLimits

CLIENT_ADDR = ("127.0.0.1", 40000)
SERVER_ADDR = ("127.0.0.1", 4443)
STACKS = ("aioquic", "qh3")


def self_signed_pem() -> tuple[bytes, bytes]:
    """A fresh self-signed certificate for localhost and its key, in PEM."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


class QuicPair:
    """A client and a server QUIC connection of one stack (aioquic or qh3, same API).

    ``pump`` moves datagrams until both are idle.
    """

    def __init__(self, stack: str = "aioquic", alpn: str = LEGACY_ALPN) -> None:
        self.now = 1.0
        configuration = importlib.import_module(f"{stack}.quic.configuration")
        connection = importlib.import_module(f"{stack}.quic.connection")
        common: dict[str, Any] = {"alpn_protocols": [alpn], "max_datagram_frame_size": 65536}
        client_config = configuration.QuicConfiguration(
            is_client=True, verify_mode=ssl.CERT_NONE, server_name="localhost", **common
        )
        server_config = configuration.QuicConfiguration(is_client=False, **common)
        with tempfile.TemporaryDirectory() as directory:
            # Separate files: qh3 mis-splits a combined PEM about one time in four.
            cert, key = Path(directory) / "cert.pem", Path(directory) / "key.pem"
            cert_pem, key_pem = self_signed_pem()
            cert.write_bytes(cert_pem)
            key.write_bytes(key_pem)
            server_config.load_cert_chain(str(cert), str(key))
        self.client_quic = connection.QuicConnection(configuration=client_config)
        self.server_quic = connection.QuicConnection(
            configuration=server_config,
            original_destination_connection_id=self.client_quic.original_destination_connection_id,
        )
        self.client_quic.connect(SERVER_ADDR, now=self.now)

    def transfer(self) -> int:
        """Move one flight each way; return the number of datagrams moved."""
        moved = 0
        for sender, receiver, addr in (
            (self.client_quic, self.server_quic, CLIENT_ADDR),
            (self.server_quic, self.client_quic, SERVER_ADDR),
        ):
            for data, _ in sender.datagrams_to_send(now=self.now):
                receiver.receive_datagram(data, addr, now=self.now)
                moved += 1
        return moved


class SessionPair(QuicPair):
    """A ``QuicPair`` with a MoQT session on each end; events collect per side.

    With ``client_session`` or ``server_session`` False that end is a raw QUIC connection the
    test scripts by hand (to play a misbehaving or quirky peer); its QUIC events collect in
    ``client_raw`` / ``server_raw``.
    """

    def __init__(
        self,
        client_limits: SessionLimits | None = None,
        server_limits: SessionLimits | None = None,
        *,
        client_session: bool = True,
        server_session: bool = True,
        stack: str = "aioquic",
        draft: Draft = DRAFT_14,
    ) -> None:
        super().__init__(stack, draft.alpn)
        self.client: MoqtSession | None = None
        self.server: MoqtSession | None = None
        if client_session:
            self.client = MoqtSession(
                self.client_quic,
                is_client=True,
                path=b"/kv",
                authority=b"localhost:4443",
                limits=client_limits,
                now=self.now,
                draft=draft,
            )
        if server_session:
            self.server = MoqtSession(
                self.server_quic, is_client=False, limits=server_limits, draft=draft
            )
        self.client_events: list[MoqtEvent] = []
        self.server_events: list[MoqtEvent] = []
        self.client_raw: list[Any] = []
        self.server_raw: list[Any] = []

    def sessions(self) -> tuple[MoqtSession, MoqtSession]:
        assert self.client is not None and self.server is not None
        return self.client, self.server

    def pump(self, max_rounds: int = 10_000) -> None:
        """Exchange datagrams and deliver QUIC events until nothing moves."""
        for _ in range(max_rounds):
            moved = self.transfer()
            self._drain(self.client_quic, self.client, self.client_events, self.client_raw)
            self._drain(self.server_quic, self.server, self.server_events, self.server_raw)
            if not moved and not self._fire_timers():
                return
            self.now += 0.001
        raise AssertionError("connections did not go idle")

    def advance(self, seconds: float) -> None:
        """Let simulated time pass (firing QUIC timers, e.g. a close's draining period)."""
        self.now += seconds
        self.pump()

    def _fire_timers(self) -> bool:
        fired = False
        for quic in (self.client_quic, self.server_quic):
            timer = quic.get_timer()
            if timer is not None and timer <= self.now:
                quic.handle_timer(now=self.now)
                fired = True
        return fired

    def _drain(
        self,
        quic: Any,
        session: MoqtSession | None,
        events: list[MoqtEvent],
        raw: list[Any],
    ) -> None:
        while (event := quic.next_event()) is not None:
            if session is None:
                raw.append(event)
            else:
                events += session.handle_event(event, now=self.now)

    def take(self, side: str) -> list[MoqtEvent]:
        """The events collected on ``side`` ("client" or "server") since the last take."""
        events = getattr(self, f"{side}_events")
        setattr(self, f"{side}_events", [])
        return events
