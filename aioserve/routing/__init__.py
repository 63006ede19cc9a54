"""Routers: which replica serves a request, from load snapshots (no Ray, no engine)."""
