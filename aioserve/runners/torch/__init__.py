"""The torch runner: TorchRunner, its set-up, persistent batch state and sampler; the only room
that sees all the others.

Imports (checked by tests/test_import_rules.py):
    may import: aioserve, aioserve.runners, aioserve.runners.attention, aioserve.runners.cpu,
        aioserve.runners.cpu.threads, aioserve.runners.gpu, aioserve.runners.model"""
