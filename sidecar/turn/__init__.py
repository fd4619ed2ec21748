"""One turn of a session, whatever front door it came through: the door parses its wire format into
a :class:`~sidecar.turn.request.TurnRequest` and renders the events of the
:class:`~sidecar.turn.core.Turn` the core runs (session recognition, token-exact continuation,
admission, lease, generation, recording)."""
