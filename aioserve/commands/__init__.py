"""Sub-commands of the ``aioserve`` CLI, one module each.

Imports (checked by tests/test_import_rules.py):
    may import: aioserve, aioserve.bench, aioserve.deploy, aioserve.runners.attention,
        aioserve.scheduling, aioserve.server, aioserve.sim
    never at module level: torch, transformers
"""
