"""The torch runner: TorchRunner (a step: apply the engine's changes, run the
forward, sample), its set-up, its persistent batch state and the sampler. The only
room that sees all the others.

Imports (checked by tests/test_import_rules.py):
    may import: aioserve, aioserve.runners, aioserve.runners.attention, aioserve.runners.cpu,
        aioserve.runners.cpu.threads, aioserve.runners.gpu, aioserve.runners.model
"""
