"""The HTTP server: app factory, typed app keys, routes that only orchestrate, auth, errors."""
