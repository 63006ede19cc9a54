"""The scheduler lab (``aioserve simulate``): the simulator, workloads, step cost, replay."""
