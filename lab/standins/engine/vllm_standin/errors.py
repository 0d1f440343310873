"""The stand-in's two error kinds: one ends the start-up, the other answers one request."""

from __future__ import annotations


class StartupError(Exception):
    """A configuration or environment problem: logged, then the process exits 1 like vLLM."""


class RequestError(Exception):
    """A client error answered with an OpenAI-style error body."""

    def __init__(
        self, status: int, message: str, err_type: str = "BadRequestError", param: str | None = None
    ):
        super().__init__(message)
        self.status = status
        self.err_type = err_type
        self.param = param


# What vLLM 0.32's API server answered (HTTP 500) for the first request after a worker was killed.
ENGINE_DEAD_MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."


class EngineDead(RequestError):
    """The engine core is dead (a headless rank was lost): this request gets HTTP 500, then the
    API server exits, as vLLM's does on EngineDeadError."""

    def __init__(self, why: str):
        super().__init__(500, ENGINE_DEAD_MESSAGE, "InternalServerError")
        self.why = why
