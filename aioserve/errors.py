"""Errors the engine raises to callers."""


class EngineError(RuntimeError):
    """The engine could not finish a request (a model step failed, or the engine stopped)."""


class EngineNotRunningError(EngineError):
    """The engine is not started, or is shutting down."""


class UnsupportedModelError(ValueError):
    """The model cannot be served exactly (raised at load); the message names the
    architecture and the reason."""


class RequestShedError(EngineError):
    """A scheduling policy refused the request (admission control, load shedding); the
    message gives its reason. Over HTTP a 503 with code ``request_shed``: retry later."""
