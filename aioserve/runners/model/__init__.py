"""The model: loading for paged attention (adapters, refusals, KV cache) and the lean Llama
forward.

Imports (checked by tests/test_import_rules.py):
    may import: aioserve, aioserve.runners.attention, aioserve.runners.cpu"""
