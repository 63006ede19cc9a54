"""The OpenAI-compatible routes: completions and chat, answered as JSON or SSE.

Imports (checked by tests/test_import_rules.py):
    may import: aioserve, aioserve.server, aioserve.server.schema
    never at module level: torch, numpy, transformers
"""
