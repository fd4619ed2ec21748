"""Logging of the serving process: text or JSON lines, each knowing the request being served.

What is known of the request in hand lives in context variables: its session (bound by the turn
core once it recognised it) and the code of the error it was answered with (noted where the error
is answered, also inside a stream that had started). The request middleware clears both around
every request; every log record made while serving carries the session (``session``; a JSON field
of its own with ``--log-format json``) and the access line names both. Message content is never
logged.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_session: ContextVar[str | None] = ContextVar("sidecar_session", default=None)
_error: ContextVar[str | None] = ContextVar("sidecar_error", default=None)


def bind_session(session_id: str) -> None:
    """The request being served belongs to this session (its id as the client knows it)."""
    _session.set(session_id)


def current_session() -> str | None:
    return _session.get()


def note_error(code: str) -> None:
    """The request in hand was answered with this error (its OpenAI ``code``, else ``type``)."""
    _error.set(code)


def current_error() -> str | None:
    return _error.get()


@contextmanager
def request_context() -> Iterator[None]:
    """Around one request: no session or error until one is noted, and none leaks into the next
    request served by the same task (keep-alive connections)."""
    tokens = _session.set(None), _error.set(None)
    try:
        yield
    finally:
        _session.reset(tokens[0])
        _error.reset(tokens[1])


class _SessionField(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "session", None) is None:
            session = _session.get()
            if session is not None:
                record.session = session
        return True


def configure(level: str, fmt: str = "text") -> None:
    """The root logger of the serving process: one stderr handler, text or one JSON object a line
    (fields time, level, logger, message, and what a line adds: session, status, ...)."""
    handler = logging.StreamHandler()
    handler.addFilter(_SessionField())
    if fmt == "json":
        from pythonjsonlogger.json import JsonFormatter

        handler.setFormatter(
            JsonFormatter(
                "%(levelname)s %(name)s %(message)s",
                rename_fields={"levelname": "level", "name": "logger"},
                timestamp="time",
            )
        )
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
