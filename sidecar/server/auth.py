"""Optional bearer-token auth, and the session scope each API key gets.

With ``--api-key`` and/or ``--api-keys-file`` set, every route needs ``Authorization: Bearer KEY``
(or ``x-api-key: KEY``, as Anthropic's clients send it) except ``/health`` and ``/`` (probes), ``/metrics``
(unless ``--protect-metrics``) and ``GET /v1/sessions`` (only when ``--no-protect-sessions``). A
wrong or missing key is a 401 in the route's error envelope.

Each key is its own *scope*: a short hash of the key (never the key itself) that prefixes the ids
of its sessions (:func:`sidecar.conversation.store.scoped_id`), so one client can never continue, list or
close another client's session, and the session id SGLang sees is unique per scope. Without auth
the scope is ``""`` and ids are unchanged.

Keys are compared through a SHA-256 lookup table, so the time a check takes does not depend on how
much of a key was right. The keys file is re-read when its modification time changes (checked at
most every :data:`RELOAD_CHECK_S` seconds); a file that turns unreadable or empty keeps the keys
that were loaded before.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from typing import Callable

from aiohttp import web

from sidecar.errors import APIError

log = logging.getLogger("sidecar.auth")

SCOPE = web.RequestKey("scope", str)  # the caller's scope ("" without auth, None if anonymous)
RELOAD_CHECK_S = 2.0


class AuthConfigError(ValueError):
    """The auth settings cannot be used (no keys in the file, unreadable file)."""


def scope_of_key(key: str) -> str:
    """The scope of an API key: 16 hex digits of a keyed hash, safe to show SGLang and logs."""
    return hashlib.blake2b(key.encode(), digest_size=8, person=b"sidecar-scope").hexdigest()


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()


def read_keys_file(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise AuthConfigError(f"cannot read API keys file {path}: {exc}") from None
    keys = []
    for number, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if any(c.isspace() for c in line):
            raise AuthConfigError(f"API keys file {path}, line {number}: a key must not contain whitespace")
        keys.append(line)
    if not keys:
        raise AuthConfigError(f"API keys file {path} holds no keys")
    return keys


class KeyStore:
    """The accepted keys: ``scope_for(token)`` is the token's scope, or None if it is not a key."""

    def __init__(self, api_key: str | None = None, keys_file: str | None = None, clock: Callable[[], float] = time.monotonic):
        if api_key is not None and (not api_key or any(c.isspace() for c in api_key)):
            raise AuthConfigError("api_key must be non-empty and without whitespace")
        self.api_key = api_key
        self.keys_file = keys_file
        self.clock = clock
        self._table: dict[bytes, str] = {}
        self._mtime: float | None = None
        self._checked_at = clock()
        file_keys = read_keys_file(keys_file) if keys_file else []
        if keys_file:
            self._mtime = self._stat()
        self._rebuild(file_keys)

    def _stat(self) -> float | None:
        try:
            return os.stat(self.keys_file).st_mtime
        except OSError:
            return None

    def _rebuild(self, file_keys: list[str]) -> None:
        keys = ([self.api_key] if self.api_key else []) + file_keys
        self._table = {_digest(k): scope_of_key(k) for k in keys}

    def _maybe_reload(self) -> None:
        now = self.clock()
        if self.keys_file is None or now - self._checked_at < RELOAD_CHECK_S:
            return
        self._checked_at = now
        mtime = self._stat()
        if mtime is None or mtime == self._mtime:
            return
        try:
            keys = read_keys_file(self.keys_file)
        except AuthConfigError as exc:
            log.warning("keeping the previous API keys: %s", exc)
            return
        self._mtime = mtime
        self._rebuild(keys)
        log.info("reloaded %d API keys from %s", len(keys), self.keys_file)

    def __len__(self) -> int:
        return len(self._table)

    def scope_for(self, token: str) -> str | None:
        self._maybe_reload()
        return self._table.get(_digest(token))


def build_key_store(server_settings) -> KeyStore | None:
    """The key store the settings ask for; None when auth is off."""
    if server_settings.api_key is None and server_settings.api_keys_file is None:
        return None
    return KeyStore(server_settings.api_key, server_settings.api_keys_file)


def bearer_token(request: web.Request) -> str | None:
    header = request.headers.get("Authorization")
    if header is None:
        return None
    kind, _, token = header.strip().partition(" ")
    if kind.lower() != "bearer":
        return ""  # present but not a bearer token: never a valid key
    return token.strip()


def request_token(request: web.Request) -> str | None:
    """The key a request carries: ``Authorization: Bearer KEY`` (OpenAI's clients, Anthropic's with
    an auth token), else ``x-api-key: KEY`` (Anthropic's clients with an API key)."""
    token = bearer_token(request)
    if token is None:
        token = request.headers.get("x-api-key")
        token = token.strip() if token is not None else None
    return token


def unauthorized(message: str) -> APIError:
    return APIError(
        401, message, type="invalid_request_error", code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"}
    )


def _open_route(request: web.Request, server_settings) -> bool:
    """Routes that answer without a key even when auth is on."""
    path = request.path
    if path in ("/health", "/"):  # probes; "/" only names the doors
        return True
    if path == "/metrics":
        return not server_settings.protect_metrics
    if path == "/v1/sessions" and request.method in ("GET", "HEAD"):
        return not server_settings.protect_sessions
    return False


def auth_middleware(store: KeyStore | None, server_settings):
    """aiohttp middleware: sets ``request[SCOPE]``; place it inside the error middleware (401s)."""

    @web.middleware
    async def middleware(request: web.Request, handler):
        if store is None:
            return await handler(request)
        token = request_token(request)
        scope = store.scope_for(token) if token else None
        if token is not None and scope is None:
            raise unauthorized("invalid API key")
        if scope is None and not _open_route(request, server_settings):
            raise unauthorized("missing API key: send 'Authorization: Bearer <key>' (or 'x-api-key: <key>')")
        request[SCOPE] = scope
        return await handler(request)

    return middleware


def request_scope(request: web.Request) -> str | None:
    """The caller's scope: "" without auth, the key's scope, or None (auth on, open route, no key)."""
    return request.get(SCOPE, "")
