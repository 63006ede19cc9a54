"""The FlexAttention backend (compiled on CUDA; on the CPU for tests): backend, block masks,
metadata.

Imports (checked by tests/test_import_rules.py):
    may import: aioserve.runners.attention"""
