"""The scheduler lab: simulator, workloads, report and plots (``aioserve simulate``)."""
