"""The FlexAttention backend (compiled on CUDA; runs on the CPU for tests): the
backend, its block masks and its per-step metadata.

Imports (checked by tests/test_import_rules.py):
    may import: aioserve.runners.attention
"""
