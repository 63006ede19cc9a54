"""Benchmarks: offline throughput (vs transformers), online serving, engine overhead.
Imports (checked by tests/test_import_rules.py):
    may import: aioserve, aioserve.runners, aioserve.runners.worker, aioserve.sim"""
