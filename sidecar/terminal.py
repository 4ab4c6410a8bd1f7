"""The rich console every command prints its tables through."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

LOG_WIDTH = 150
"""Columns a console gets when it writes to a pipe or a file, where rich would assume 80 and
cut a table's labels and columns short."""


def console() -> Console:
    """A rich console, wide enough in a pipe or a log file too. rich is imported here, not
    with the module: a relay's install has no rich, and its commands that need the sidecar
    install must still get far enough to say so."""
    from rich.console import Console

    out = Console()
    if not out.is_terminal:
        out.width = max(out.width, LOG_WIDTH)
    return out
