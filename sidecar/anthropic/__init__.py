"""Anthropic's Messages API (``POST /v1/messages``, ``/v1/messages/count_tokens``) as a front door:
the request and its content blocks, every answer, SSE event and error in Anthropic's shapes."""
