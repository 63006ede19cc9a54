"""The scheduler lab (``aioserve simulate``): the simulator on the engine's own step loop
and its runners (a virtual clock behind ``runners/base.py``), workloads and scenarios,
the calibrated step cost, the replay on a real engine; its reports (figures, tables,
plots, HTML) are in :mod:`aioserve.sim.reports`.

Imports (checked by tests/test_import_rules.py):
    may import: aioserve, aioserve.dashboard, aioserve.runners, aioserve.scheduling
    never at module level: torch, transformers
"""
