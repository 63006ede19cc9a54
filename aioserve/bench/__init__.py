"""Benchmarks: offline throughput (vs transformers), online serving, engine overhead."""
