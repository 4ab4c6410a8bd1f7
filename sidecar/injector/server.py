"""The webhook's HTTPS server: the only part of the injector that does I/O.

A thread per connection (the standard library's ThreadingHTTPServer): admission traffic is a
few requests per pod created, and a review is decided in microseconds. TLS is set up in the
connection's thread, so a client that stalls its handshake holds only its own thread, and
every connection has a deadline. The certificate is read again when its files change:
cert-manager renews it in place.
"""

from __future__ import annotations

import json
import signal
import ssl
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from sidecar import log
from sidecar.address import Address
from sidecar.injector.mutation import Decision, Inject, Leave, Refuse, decide
from sidecar.injector.review import MAX_REVIEW_BYTES, AdmissionRequest, ReviewError, response
from sidecar.injector.template import InjectionTemplate

INJECT_PATH = "/inject"
CONNECTION_TIMEOUT_S = 10.0
"""The API server gives a webhook at most 30 s (timeoutSeconds; the chart sets 10)."""

_log = log.get_logger(__name__)


class ReloadingTLS:
    """A server-side TLS context, rebuilt when the certificate or key file changes."""

    def __init__(self, cert: Path, key: Path) -> None:
        self._files = (cert, key)
        self._lock = threading.Lock()
        self._stamp: tuple[float, ...] = ()
        self._context = self._current()

    def _current(self) -> ssl.SSLContext:
        stamp = tuple(path.stat().st_mtime for path in self._files)
        with self._lock:
            if stamp != self._stamp:
                context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
                context.minimum_version = ssl.TLSVersion.TLSv1_2
                context.load_cert_chain(*self._files)
                self._context, self._stamp = context, stamp
            return self._context

    def wrap(self, sock: Any) -> ssl.SSLSocket:
        return self._current().wrap_socket(sock, server_side=True)


class InjectorServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: Address, tls: ReloadingTLS, template: InjectionTemplate) -> None:
        super().__init__(address, _Handler)
        self.tls = tls
        self.template = template

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"https://{host}:{port}{INJECT_PATH}"

    def finish_request(self, request: Any, client_address: Any) -> None:
        request.settimeout(CONNECTION_TIMEOUT_S)
        try:
            secure = self.tls.wrap(request)
        except (ssl.SSLError, OSError) as exc:
            _log.info("tls_handshake_failed", peer=client_address[0], error=str(exc))
            request.close()
            return
        super().finish_request(secure, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        _log.exception("request_failed", peer=client_address[0])


class _Handler(BaseHTTPRequestHandler):
    server: InjectorServer
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        if self.path in ("/healthz", "/readyz"):
            self._send(200, b"ok\n", "text/plain")
        else:
            self._send(404, b"not found\n", "text/plain")

    def do_POST(self) -> None:
        if self.path.split("?")[0] != INJECT_PATH:
            self._send(404, b"not found\n", "text/plain")
            return
        try:
            body = self._body()
            request = AdmissionRequest.parse(body)
        except ReviewError as exc:
            _log.info("review_refused", peer=self.client_address[0], error=str(exc))
            self._send(400, f"kvmoq injector: {exc}\n".encode(), "text/plain")
            return
        decision: Decision | None = None
        if request.pod is not None and request.operation == "CREATE":
            decision = decide(request.pod, self.server.template)
            _log_decision(request, decision)
        self._send(200, json.dumps(response(request.uid, decision)).encode(), "application/json")

    def _body(self) -> bytes:
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            raise ReviewError("a Content-Length is required")
        if int(length) > MAX_REVIEW_BYTES:
            self.close_connection = True  # the body is not read
            raise ReviewError(f"body longer than {MAX_REVIEW_BYTES} bytes")
        return self.rfile.read(int(length))

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        _log.debug("http", peer=self.client_address[0], line=format % args)


def _log_decision(request: AdmissionRequest, decision: Decision) -> None:
    metadata = request.pod.get("metadata") if isinstance(request.pod, dict) else None
    name = (
        (metadata.get("name") or metadata.get("generateName"))
        if isinstance(metadata, dict)
        else None
    )
    where = {"namespace": request.namespace, "pod": str(name), "uid": request.uid}
    if isinstance(decision, Inject):
        _log.info("injected", operations=len(decision.patch), **where)
    elif isinstance(decision, Refuse):
        _log.warning("refused", reason=decision.message, **where)
    elif isinstance(decision, Leave):
        _log.info("left_alone", reason=decision.reason, **where)


def serve(
    address: Address,
    tls: ReloadingTLS,
    template: InjectionTemplate,
    serving: Callable[[str], None],
) -> None:
    """Serve until SIGTERM or SIGINT; `serving(url)` once requests are accepted."""
    with InjectorServer(address, tls, template) as server:

        def stop(signum: int, frame: object) -> None:
            threading.Thread(target=server.shutdown, daemon=True).start()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        serving(server.url)
        server.serve_forever()
