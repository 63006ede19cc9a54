"""The websockets: ``/ws`` (generations) and ``/ws/stats`` (the dashboard's frames).

Imports (checked by tests/test_import_rules.py):
    may import: aioserve, aioserve.dashboard, aioserve.server, aioserve.server.openai,
        aioserve.server.schema
    never at module level: torch, numpy, transformers
"""
