"""How many intra-op threads the CPU forward uses: the CPUs the process may use, the load others
put on them, and the governor moving the count. No torch here."""
