"""GPU-only pieces: CUDA-graph capture of decode steps.

Imports (checked by tests/test_import_rules.py):
    may import: aioserve.runners.attention"""
