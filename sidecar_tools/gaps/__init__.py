"""Offline evaluation of lease policies on recorded or synthetic tool gaps (``gap-replay``)."""
