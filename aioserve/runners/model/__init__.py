"""The model: loading a transformers model for paged attention (adapters, refusals,
KV-cache sizing) and the opt-in lean Llama forward.

Imports (checked by tests/test_import_rules.py):
    may import: aioserve, aioserve.runners.attention, aioserve.runners.cpu
"""
