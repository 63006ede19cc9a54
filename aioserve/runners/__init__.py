"""Model runners: the engine's boundary to the model (plain data in, plain data out).

``base.py`` is the boundary (``ScheduledBatch`` in, ``RunnerOutput`` out, the
``ModelRunner`` protocol); ``batch_invariance.py`` the one policy that keeps a
request's greedy tokens independent of its batch. The rooms below it: ``torch/``
(TorchRunner: a step from the engine's changes to sampled tokens), ``model/`` (loading,
adapters, the lean forward), ``attention/`` (the backend seam and its backends),
``cpu/`` and ``gpu/`` (device-only pieces). Other runners (the simulator's,
``aioserve/sim/runner.py``; the tests' scripted double) implement ``base.py`` alone.

Imports (checked by tests/test_import_rules.py):
    may import: aioserve, aioserve.runners.cpu
"""
