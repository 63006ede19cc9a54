"""Model runners: the engine's boundary to the model (plain data in, plain data out)."""
