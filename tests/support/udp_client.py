"""A blocking MoQT client for interop tests: aioquic's sans-I/O QuicConnection on a UDP socket.

Deliberately not the project's asyncio transport: this drives ``MoqtSession`` with nothing
between it and the socket, so an interop failure points at the protocol core.
"""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Callable
from pathlib import Path

from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection

from sidecar.moqt.protocol.events import MoqtEvent
from sidecar.moqt.protocol.session import MoqtSession


class UdpClient:
    def __init__(self, host: str, port: int, ca: Path) -> None:
        config = QuicConfiguration(
            is_client=True,
            alpn_protocols=["moq-00"],
            max_datagram_frame_size=65536,
            server_name=host,
        )
        config.load_verify_locations(str(ca))
        self.address = (host, port)
        self.quic = QuicConnection(configuration=config)
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.socket.setblocking(False)
        self.quic.connect(self.address, now=time.monotonic())
        self.session = MoqtSession(
            self.quic,
            is_client=True,
            path=b"",
            authority=f"{host}:{port}".encode(),
            now=time.monotonic(),
        )
        self.events: list[MoqtEvent] = []

    def run_until(self, done: Callable[[list[MoqtEvent]], bool], timeout: float) -> None:
        """Drive I/O until ``done(self.events)`` holds; fail after ``timeout`` seconds.

        ``done`` runs after every batch of events, so it may also answer them.
        """
        deadline = time.monotonic() + timeout
        while True:
            self._send(time.monotonic())
            if done(self.events):
                return
            now = time.monotonic()
            if now >= deadline:
                raise AssertionError(f"timed out; events so far: {self.events[-5:]}")
            wakeups = [deadline, now + 0.05, self.quic.get_timer(), self.session.next_timer()]
            wait = min(t for t in wakeups if t is not None) - now
            readable, _, _ = select.select([self.socket], [], [], max(wait, 0.0))
            now = time.monotonic()
            while readable:
                try:
                    data = self.socket.recv(65536)
                except BlockingIOError:
                    break
                self.quic.receive_datagram(data, self.address, now)
            timer = self.quic.get_timer()
            if timer is not None and timer <= now:
                self.quic.handle_timer(now)
            self.session.tick(now)
            while (event := self.quic.next_event()) is not None:
                self.events += self.session.handle_event(event, now)

    def close(self) -> None:
        self.session.close()
        self._send(time.monotonic())
        self.socket.close()

    def _send(self, now: float) -> None:
        for data, address in self.quic.datagrams_to_send(now):
            self.socket.sendto(data, address)
