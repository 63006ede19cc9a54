"""The torch runner: TorchRunner, its set-up, persistent batch state and sampler; the only room
that sees all the others."""
