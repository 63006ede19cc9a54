"""Workloads: scenarios, trace formats and options, synthetic generators, one request type."""
