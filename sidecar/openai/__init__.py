"""OpenAI's wire format: the chat-completions request, and every response and SSE shape it answers with."""
