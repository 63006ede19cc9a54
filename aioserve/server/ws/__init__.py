"""The websockets: ``/ws`` (generate and cancel messages, one bounded outbox per socket,
one anyio task group per socket) and the dashboard's stats feed.

Imports (checked by tests/test_import_rules.py):
    may import: aioserve, aioserve.dashboard, aioserve.server, aioserve.server.openai,
        aioserve.server.schema
    never at module level: torch, numpy, transformers
"""
