"""The online serving benchmark (``aioserve bench serve``): client, metrics and plots.

Imports (checked by tests/test_import_rules.py):
    may import: aioserve, aioserve.bench, aioserve.sim
    never at module level: torch, transformers, matplotlib"""
