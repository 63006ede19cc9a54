"""The online serving benchmark (``aioserve bench serve``): a client that sends Poisson
or replayed arrivals to a running server over SSE or the websocket, the per-request
records, the serving metrics (TTFT, TPOT, ITL, E2E, goodput, per group) and their plots.

Imports (checked by tests/test_import_rules.py):
    may import: aioserve, aioserve.bench, aioserve.sim
    never at module level: torch, transformers, matplotlib
"""
