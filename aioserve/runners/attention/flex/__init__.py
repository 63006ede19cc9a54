"""The FlexAttention backend (compiled on CUDA; on the CPU for tests): backend, block masks,
metadata."""
