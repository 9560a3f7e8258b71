"""The project's error types.

`TokentraceError` is the one error the CLI turns into a single line on stderr and exit code 2
(bad input or usage). Everything that rejects a user's input raises it (or a subclass) with a
message that already names the file and the problem, so callers never need to add context.
"""

from __future__ import annotations


class TokentraceError(Exception):
    """Bad input or usage: the message is one line, naming the file (when there is one) and the problem."""


class TraceError(TokentraceError):
    """A trace file or directory could not be read as a torch.profiler trace."""

    def __init__(self, path: object, problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")
