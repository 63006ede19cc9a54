"""Sub-commands of the ``aioserve`` CLI, one module each.

Imports (checked by tests/test_import_rules.py):
    may import: aioserve, aioserve.bench, aioserve.bench.models, aioserve.bench.online,
        aioserve.deploy, aioserve.runners.attention,
        aioserve.scheduling, aioserve.server, aioserve.sim, aioserve.sim.reports,
        aioserve.runners.torch.runner, aioserve.runners.cpu.cpu_info
    never at module level: torch, transformers
"""
