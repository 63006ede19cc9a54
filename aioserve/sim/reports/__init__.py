"""What the scheduler lab reports of its runs: the comparison figures (goodput, TTFT /
TPOT / E2E, per tenant and priority, Jain's index), the text and JSON summaries, the
policy comparison (text, plots, HTML), the dashboard replay page and the article's
figures. It reads results; it runs nothing.

Imports (checked by tests/test_import_rules.py):
    may import: aioserve, aioserve.dashboard, aioserve.sim
    never at module level: torch, transformers, matplotlib
"""
