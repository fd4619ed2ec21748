"""OpenAI's Responses API (``POST /v1/responses``, stateless use) as a front door: the request and
its input items, the response object, its SSE event sequence and in-stream errors."""
