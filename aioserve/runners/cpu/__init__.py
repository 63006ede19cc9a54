"""CPU-only pieces: compiled kernels (``csrc/``), packed and panel linear products,
malloc settings, row padding. Leaves: they know nothing of the engine or attention.

Imports (checked by tests/test_import_rules.py):
    may import: (nothing else in aioserve)
"""
