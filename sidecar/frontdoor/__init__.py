"""What every front door shares over HTTP: reading a body into its request model, the canonical
(chat-template) messages a wire format converts to, a reply cut into content blocks, and the SSE
stream whose headers go out with its first event. The doors themselves (``sidecar.openai``,
``sidecar.anthropic``, ``sidecar.responses``) only parse their format and render the turn's events."""
