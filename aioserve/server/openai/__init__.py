"""The OpenAI-compatible routes: ``/v1/completions`` and ``/v1/chat/completions``, one
call's life (validate with :mod:`aioserve.server.schema`, queue its choices, answer as
JSON or as server-sent events, abort when the client leaves), chat templates.

Imports (checked by tests/test_import_rules.py):
    may import: aioserve, aioserve.server, aioserve.server.schema
    never at module level: torch, numpy, transformers
"""
