"""What the scheduler lab reports of its runs (figures, tables, plots, HTML); it runs nothing.

Imports (checked by tests/test_import_rules.py):
    may import: aioserve, aioserve.dashboard, aioserve.sim
    never at module level: torch, transformers, matplotlib
"""
