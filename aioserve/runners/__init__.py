"""Model runners: the engine's boundary to the model (``base.py``: plain data in, plain data out)
and the torch runner's rooms (``torch/``, ``model/``, ``attention/``, ``cpu/``, ``gpu/``)."""
