"""Models to benchmark without a download: random weights of a real shape, tiny decoders of many
architectures, and their coverage check."""
