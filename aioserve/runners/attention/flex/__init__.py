"""The FlexAttention backend (compiled on CUDA; runs on the CPU for tests)."""
