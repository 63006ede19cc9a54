"""Attention over the paged KV cache: the backend seam (``backend.py``), its registry and
backends (``reference.py``, ``flex/``), and the reference backend's paths.

Imports (checked by tests/test_import_rules.py):
    may import: aioserve.runners, aioserve.runners.cpu, aioserve.runners.attention.flex"""
