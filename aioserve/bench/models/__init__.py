"""Models to benchmark without a download: random weights of a real shape, tiny decoders of many
architectures, and their coverage check.

Imports (checked by tests/test_import_rules.py):
    may import: aioserve, aioserve.bench"""
