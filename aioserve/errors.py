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


class AdmissionError(EngineError):
    """The engine's admission limit refused the request (``reason``: ``queue_full`` or
    ``queue_timeout``); over HTTP a 429 with ``Retry-After: retry_after_s``, on the
    websocket an error with that code. The client may retry later."""

    reason = "admission"

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class QueueFullError(AdmissionError):
    """The waiting queue held ``max_waiting`` requests when this one arrived."""

    reason = "queue_full"


class QueueTimeoutError(AdmissionError):
    """The request waited ``max_queue_time_s`` without being scheduled; it was ended."""

    reason = "queue_timeout"
