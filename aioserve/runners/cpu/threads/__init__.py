"""How many intra-op threads the CPU forward uses: the CPUs the process may use, the load others
put on them, and the governor moving the count. No torch here.

Imports (checked by tests/test_import_rules.py):
    may import: (nothing else in aioserve)
    never at module level: torch, numpy"""
