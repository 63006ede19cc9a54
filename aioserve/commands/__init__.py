"""Sub-commands of the ``aioserve`` CLI, one module each."""
