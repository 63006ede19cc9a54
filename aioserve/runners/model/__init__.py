"""The model: loading for paged attention (adapters, refusals, KV cache) and the lean Llama
forward."""
