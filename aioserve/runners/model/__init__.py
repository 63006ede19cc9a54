"""Loading a transformers model for paged attention: adapters, layer rules, the lean forward."""
