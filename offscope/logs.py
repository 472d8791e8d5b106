"""structlog set-up: JSON lines on stderr (machine-readable, never mixed into stdout)."""

from __future__ import annotations

import logging
import sys

import structlog


def _stderr_logger(*_args: object) -> structlog.PrintLogger:
    # The stream is looked up per logger, not captured once: whoever replaced
    # sys.stderr since (a test runner, an embedding program) gets the lines, and
    # a closed stream left behind by them cannot break logging.
    return structlog.PrintLogger(sys.stderr)


def configure(level: str = "info", json_output: bool = True) -> None:
    renderer = (
        structlog.processors.JSONRenderer()
        if json_output
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            getattr(logging, level.upper(), logging.INFO)
        ),
        logger_factory=_stderr_logger,
        cache_logger_on_first_use=False,
    )


def quiet() -> None:
    """Only errors (eval runs and tests: the trace is the record, not the log)."""
    configure("error")
