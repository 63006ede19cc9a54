"""Built-in scheduling policies, registered as ``aioserve.schedulers`` entry points."""
