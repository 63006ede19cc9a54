"""Benchmarks: offline throughput, engine overhead, synthetic workloads, servers and co-tenants
in child processes; the online client in :mod:`.online`, the models in :mod:`.models`.

Imports (checked by tests/test_import_rules.py):
    may import: aioserve, aioserve.runners, aioserve.runners.torch, aioserve.sim,
        aioserve.bench.models"""
