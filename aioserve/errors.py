"""Errors the engine raises to callers."""


class EngineError(RuntimeError):
    """The engine could not finish a request (a model step failed, or the engine stopped)."""


class EngineNotRunningError(EngineError):
    """The engine is not started, or is shutting down."""
