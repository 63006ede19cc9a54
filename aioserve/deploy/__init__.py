"""Deployments of aioserve on other serving frameworks (``aioserve[ray]``: Ray Serve)."""
