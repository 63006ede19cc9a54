"""Attention over the paged KV cache: the backend seam (``backend.py``), its registry and
backends (``reference.py``, ``flex/``), and the reference backend's paths."""
