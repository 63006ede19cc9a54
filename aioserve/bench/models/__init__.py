"""The models benchmarks run on without a download: random weights of a real shape
(``--random-model``, shapes in ``model_shapes/``), tiny random decoders of many
transformers architectures, and the coverage check that compares each with
transformers' ``generate()``.

Imports (checked by tests/test_import_rules.py):
    may import: aioserve, aioserve.bench
"""
