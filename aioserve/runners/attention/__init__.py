"""Attention over the paged KV cache: the backend seam and its backends."""
