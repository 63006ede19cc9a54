"""CPU-only leaves: compiled kernels, packed and panel products, malloc settings, row padding,
thread counts."""
