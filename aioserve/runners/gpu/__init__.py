"""GPU-only pieces: CUDA-graph capture of decode steps."""
