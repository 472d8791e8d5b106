"""structlog set-up: JSON lines on stderr (machine-readable, never mixed into stdout)."""

from __future__ import annotations

import logging
import sys

import structlog


def configure(level: str = "info", json_output: bool = True) -> None:
    renderer = structlog.processors.JSONRenderer() if json_output else structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper(), logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )


def quiet() -> None:
    """Only errors (eval runs and tests: the trace is the record, not the log)."""
    configure("error")
