"""Errors: what a tool raises to fail a call, and what the SDK raises when the kernel says no."""

from __future__ import annotations

from typing import Literal

ErrorKind = Literal["retryable", "fatal", "poison"]


class ToolError(Exception):
    """A tool's failure, with how the kernel should treat it.

    `retryable` (the default) may succeed on another attempt, within the tool's retry policy;
    `fatal` will fail the same way again and is never retried; `poison` says the input itself
    is harmful. The model reads the message. Any other exception a tool raises is `retryable`,
    with its type and text as the message.
    """

    def __init__(self, message: str, kind: ErrorKind = "retryable") -> None:
        super().__init__(message)
        self.message = message
        self.kind: ErrorKind = kind

    @classmethod
    def retryable(cls, message: str) -> ToolError:
        """A failure another attempt may not have."""
        return cls(message, "retryable")

    @classmethod
    def fatal(cls, message: str) -> ToolError:
        """A failure every attempt would have: never retried."""
        return cls(message, "fatal")

    @classmethod
    def poison(cls, message: str) -> ToolError:
        """The input itself is harmful: never retried."""
        return cls(message, "poison")

    def __repr__(self) -> str:
        return f"ToolError({self.message!r}, kind={self.kind!r})"


class WorkerRefused(Exception):
    """The kernel refused the worker's session (a bad tool definition, a fingerprint conflict, a
    key without the grant): connecting again would not help.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"kernel refused the worker session ({code}): {message}")
        self.code = code
        self.message = message


class KernelError(Exception):
    """A kernel request failed: `code` is the gRPC status code's name (`INVALID_ARGUMENT`,
    `NOT_FOUND`, `PERMISSION_DENIED`, ...), `message` the kernel's explanation, which names the
    field at fault.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class ConcurrentCallIdError(KernelError):
    """Two calls under one call id ran together: a call's id names one call of the run, and the
    kernel refused this one because another call holds the id in flight with another tool or
    other arguments (code `ALREADY_EXISTS`, a message starting `concurrent_call_id:`). Give each
    of two calls made together an id of its own, or wait for the first to settle.
    """


class ToolCallRejected(Exception):
    """A tool called directly inside a run (`await refund(ctx, cents=25_000)` in a hosted
    handler) needed a person's approval and did not get it: `reason` is what the kernel recorded
    (who rejected it and why), `expired` says whether the approval ran out unanswered instead.
    """

    def __init__(self, tool_name: str, reason: str, expired: bool) -> None:
        super().__init__(reason)
        self.tool_name = tool_name
        self.reason = reason
        self.expired = expired

    def __repr__(self) -> str:
        return f"ToolCallRejected({self.tool_name!r}, {self.reason!r}, expired={self.expired!r})"
