"""Benchmarks: offline throughput (vs transformers static batching, or without prefix
caching), engine overhead, synthetic workloads, servers and busy co-tenants in child
processes. The online client is :mod:`aioserve.bench.online`; the models benchmarks run
on (random weights of a real shape, tiny architectures) are :mod:`aioserve.bench.models`.

Imports (checked by tests/test_import_rules.py):
    may import: aioserve, aioserve.runners, aioserve.runners.torch, aioserve.sim,
        aioserve.bench.models
"""
