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
