"""The scheduler lab (``aioserve simulate``): the simulator, workloads, step cost, replay.

Imports (checked by tests/test_import_rules.py):
    may import: aioserve, aioserve.dashboard, aioserve.runners, aioserve.scheduling
    never at module level: torch, transformers
"""
