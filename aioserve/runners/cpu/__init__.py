"""CPU-only pieces: compiled kernels (``csrc/``), packed and panel linear products,
malloc settings, row padding; the thread count in :mod:`~aioserve.runners.cpu.threads`.
Leaves: they know nothing of the engine or attention.

Imports (checked by tests/test_import_rules.py):
    may import: (nothing else in aioserve)
"""
