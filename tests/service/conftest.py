"""The generated stubs live in the client package; until it is installed into the venv
(scripts/setup.sh installs ./clients/python), import them from the source tree."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

CLIENT_SRC = Path(__file__).resolve().parents[2] / "clients" / "python" / "src"

if importlib.util.find_spec("kvmoq_client") is None:
    sys.path.insert(0, str(CLIENT_SRC))
