"""The online serving benchmark (``aioserve bench serve``): client, metrics and plots."""
