"""Deployments of aioserve on other serving frameworks (``aioserve[ray]``: Ray Serve).

Imports (checked by tests/test_import_rules.py):
    may import: aioserve, aioserve.server
"""
