"""Where a request names its session, the same for every front door.

The ``X-Session-Id`` header names it for any door; a door whose API has a body field for it
(OpenAI's chat completions: ``session_id``, then ``user``) passes those as the fallbacks. What
the id may be is the session store's rule (``sidecar.conversation.store.check_session_id``).
"""

from __future__ import annotations

from aiohttp import web

SESSION_HEADER = "X-Session-Id"


def explicit_session_id(request: web.Request, *body_ids: str | None) -> str | None:
    """The client's explicit session id: the header, else the first non-empty of ``body_ids``
    (None: the session is recognised from its messages)."""
    session_id = request.headers.get(SESSION_HEADER)
    for candidate in body_ids:
        session_id = session_id or candidate
    return session_id
