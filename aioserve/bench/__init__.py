"""Benchmarks: offline throughput, engine overhead, synthetic workloads, servers and co-tenants
in child processes; the online client in :mod:`.online`, the models in :mod:`.models`."""
