"""CPU-only pieces: compiled kernels, packed/panel linear products, malloc settings, row padding."""
