"""structlog set up once per process.

JSON lines when stderr is not a terminal (production, Kubernetes, CI logs that
machines read); a readable console renderer for a person at a terminal.
"""

from __future__ import annotations

import logging
import os
import sys

import structlog

_configured = False


def configure(level: str | None = None, json: bool | None = None) -> None:
    """Configure structlog and stdlib logging; later calls are no-ops."""
    global _configured
    if _configured:
        return
    _configured = True
    level_name = (level or os.environ.get("KVMOQ_LOG_LEVEL", "info")).upper()
    level_no = logging.getLevelNamesMapping().get(level_name, logging.INFO)
    if json is None:
        env = os.environ.get("KVMOQ_LOG_FORMAT")
        json = env == "json" if env else not sys.stderr.isatty()
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level_no),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    logging.basicConfig(level=max(level_no, logging.WARNING), stream=sys.stderr)


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    return structlog.get_logger(name)
