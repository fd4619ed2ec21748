"""OpenAI-compatible agent-session sidecar for SGLang."""

__version__ = "0.1.0"
