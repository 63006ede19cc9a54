"""CPU-only leaves: compiled kernels, packed and panel products, malloc settings, row padding,
thread counts.

Imports (checked by tests/test_import_rules.py):
    may import: (nothing else in aioserve)"""
