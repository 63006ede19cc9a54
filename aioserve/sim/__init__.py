"""The scheduler lab: simulator, workloads, report and plots (``aioserve simulate``),
and the simulator's runner (a virtual clock behind ``runners/base.py``).

Imports (checked by tests/test_import_rules.py):
    may import: aioserve, aioserve.dashboard, aioserve.runners
"""
