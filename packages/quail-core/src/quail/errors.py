"""The errors Quail raises: each says what was wrong, where, and what would be right."""

from __future__ import annotations

from dataclasses import dataclass, field


class QuailError(Exception):
    """Base class of every error Quail raises on purpose."""


class CompileError(QuailError):
    """A query (SQL or builder) that Quail cannot compile, with its position when known."""

    def __init__(self, message: str, *, line: int | None = None, column: int | None = None) -> None:
        self.detail = message
        self.line = line
        self.column = column
        where = f" (line {line}, column {column})" if line is not None and column is not None else ""
        super().__init__(f"{message}{where}")


class GeneralRuleError(CompileError):
    """A statement the planner of one query block does not plan (AI calls in several blocks, an AI condition of an
    outer join, an AI call over an expression, no AI call at all, ...). `Session.sql` answers it by the general
    rule instead — each AI call a lookup over its table — and raises this only when that cannot either."""


class GeneralRuleOnly(GeneralRuleError):
    """A statement only the general rule answers (AI aggregates): when it cannot, its own error is the one to show."""


@dataclass(frozen=True)
class Refusal:
    """Why something cannot run: a value, so planners can compare and report it."""

    constraint: str
    reasons: tuple[str, ...] = ()
    needed: float | None = None
    available: float | None = None
    unit: str | None = None
    hints: tuple[str, ...] = field(default=())

    def describe(self) -> str:
        parts = [self.constraint]
        parts.extend(self.reasons)
        if self.needed is not None or self.available is not None:
            unit = f" {self.unit}" if self.unit else ""
            parts.append(f"needed {_number(self.needed)}{unit}, available {_number(self.available)}{unit}")
        parts.extend(self.hints)
        return "; ".join(parts)


def _number(value: float | None) -> str:
    if value is None:
        return "unknown"
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.4g}"


class RefusalError(QuailError):
    """Raised when a refusal must stop the caller; carries the `Refusal` value."""

    def __init__(self, refusal: Refusal) -> None:
        self.refusal = refusal
        super().__init__(refusal.describe())


class ConfigError(QuailError, ValueError):
    """A configuration value that cannot work (names the field): a ValueError, and a user error to the CLI."""


class UsageError(QuailError):
    """A command-line option, argument or file that cannot be used as given (a bad path, a duplicate name)."""


class ModelFileError(QuailError, ValueError):
    """A model's file (weights, tokenizer, config) that is missing, damaged or of another kind: names the file
    and what was wrong. A ValueError, and a user error to the command line."""


class PlanEditError(QuailError):
    """An edit of a physical plan that would make it invalid."""


class ComputeError(QuailError):
    """Model work failed on the far side of a compute provider: the worker's error, with its traceback."""

    def __init__(self, message: str, remote_traceback: str | None = None) -> None:
        self.remote_traceback = remote_traceback
        super().__init__(message)


class WorkerLostError(ComputeError):
    """A compute worker died while it held a query (a crash, a signal, out of memory)."""


class LargeInputWarning(UserWarning):
    """A query's model part is about to read far more rows than a query usually does (a cross join hidden in a
    CTE, a condition left out): said before the first token, so a user can stop it (Ctrl-C) or `explain()` it."""


class QueryCancelledError(QuailError):
    """The query was cancelled before it finished (on a server: by this client, another, or the server stopping)."""


class ServerError(QuailError):
    """A Quail server could not be reached, or failed on its side (its log has the traceback)."""
