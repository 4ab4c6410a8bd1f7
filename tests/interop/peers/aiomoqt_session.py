"""Opening an aiomoqt draft-14 session the way every aiomoqt peer does.

Runs under .venv-aiomoqt (Python 3.12). aiomoqt runs on aiopquic (picoquic), not aioquic,
so it is a fully independent QUIC stack as well as an independent MoQT one.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from aiomoqt.client import MOQTClient

DRAFT = 14


def draft14_client(url: str, ca: str) -> MOQTClient:
    """A raw-QUIC client offering draft-14 only, trusting `ca`; `.connect()` opens the session.

    SSLKEYLOGFILE (TLS secrets, for Wireshark) and QLOGDIR (qlog traces) are honoured so a
    failing run can be captured on the wire without changing the command line.
    """
    parts = urlsplit(url)
    if parts.scheme != "moqt" or parts.hostname is None or parts.port is None:
        raise SystemExit(f"need moqt://host:port[/path], got {url!r}")
    return MOQTClient(
        parts.hostname,
        parts.port,
        # With its query: moq-relay's clients (and kvmoq's) carry a token as ?jwt=.
        path=(parts.path + (f"?{parts.query}" if parts.query else "")) or None,
        use_quic=True,
        verify_tls=True,
        ca_file=os.path.abspath(ca),
        supported_drafts=DRAFT,
        keylog_filename=os.environ.get("SSLKEYLOGFILE"),
        qlog_dir=os.environ.get("QLOGDIR"),
    )
