"""Attention over the paged KV cache: the backend seam and its backends.

``backend.py`` is the seam (the ``AttentionBackend`` protocol every forward goes
through), ``registry.py`` names the backends, ``reference.py`` and ``flex/`` are
the backends; ``paged.py`` is the reference arithmetic and the transformers hook,
``paged_metadata.py`` a step's metadata, ``layer_rules.py`` each layer's rules; the
rest are the reference backend's decode paths (gather, sparse, eager math, masks).

Imports (checked by tests/test_import_rules.py):
    may import: aioserve.runners, aioserve.runners.cpu, aioserve.runners.attention.flex
"""
