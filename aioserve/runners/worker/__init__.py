"""The runner's worker: TorchRunner, its persistent batch state and the sampler."""
