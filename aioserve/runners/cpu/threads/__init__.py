"""How many intra-op threads the CPU forward computes with: the CPUs the process may
use (affinity, cgroup quota), the load other processes put on them (``/proc``), and
the governor that moves the count down while they are busy and back when they leave.
Plain Python: no torch here (the runner applies the count).

Imports (checked by tests/test_import_rules.py):
    may import: (nothing else in aioserve)
    never at module level: torch, numpy
"""
