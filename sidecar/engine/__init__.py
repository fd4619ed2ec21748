"""SGLang as the sidecar reaches it: the HTTP client, the /generate request, the workers."""
