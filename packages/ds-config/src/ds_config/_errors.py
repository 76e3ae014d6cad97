"""The one exception type for configuration problems, and the warning category."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class _NoValue:
    """The marker for "no offending value"; pickles by name, so it stays the one marker across processes."""

    def __repr__(self) -> str:
        return "<no value>"

    def __reduce__(self) -> str:
        return "_NO_VALUE"


_NO_VALUE = _NoValue()


@dataclass(frozen=True)
class ConfigProblem:
    """One problem of a config: where it is, what was found, and what to do about it."""

    path: str
    """Dotted key path, e.g. ``zero_optimization.stage`` (``<root>`` for the config as a whole)."""
    message: str
    """What was expected, or what to change."""
    value: Any = _NO_VALUE
    """The offending value, when there is one."""
    strict_only: bool = False
    """True for an unknown or unsupported key: non-strict loading would warn and ignore it instead."""
    deprecated_with_replacement: bool = False
    """True when a deprecated key and its replacement are given together (see :class:`DeprecatedKeyConflictError`)."""

    def __str__(self) -> str:
        if self.value is _NO_VALUE:
            return f"{self.path}: {self.message}"
        return f"{self.path} = {_short_repr(self.value)}: {self.message}"


def _short_repr(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ConfigError(ValueError):
    """Every problem found in a DeepSpeed config, reported at once.

    ``problems`` holds one :class:`ConfigProblem` per problem; ``str(error)`` lists them all. A single
    message (``ConfigError("...")``, as code raising DeepSpeed-style errors writes) or a single
    :class:`ConfigProblem` is one problem about the config as a whole. The error pickles with its
    problems, so a rank can send it to another process.
    """

    def __init__(
        self,
        problems: list[ConfigProblem] | ConfigProblem | str,
        source: str | None = None,
        hint: str | None = None,
    ) -> None:
        if isinstance(problems, str):
            problems = [ConfigProblem("<root>", problems)] if problems else []
        elif isinstance(problems, ConfigProblem):
            problems = [problems]
        if not problems:
            raise ValueError("ConfigError needs at least one problem")
        self.problems = list(problems)
        self.source = source
        self.hint = hint
        super().__init__(self._render())

    def __reduce__(self) -> tuple:
        # the default rebuilds from ``args`` (the rendered text); rebuild from the problems instead
        return (type(self), (self.problems, self.source, self.hint), self.__dict__)

    def _render(self) -> str:
        where = f" ({self.source})" if self.source else ""
        only = self.problems[0]
        if len(self.problems) == 1 and only.path == "<root>" and only.value is _NO_VALUE and self.source:
            # the file as a whole (missing, unreadable, not JSON): one line that names it
            return "\n".join(
                [f"DeepSpeed config {self.source}: {only.message}", *([self.hint] if self.hint else [])]
            )
        count = len(self.problems)
        noun = "problem" if count == 1 else "problems"
        lines = [f"{count} {noun} in DeepSpeed config{where}:"]
        lines += [f"  - {problem}" for problem in self.problems]
        if self.hint:
            lines.append(self.hint)
        return "\n".join(lines)

    @property
    def paths(self) -> list[str]:
        """The dotted key paths of all problems, in report order."""
        return [problem.path for problem in self.problems]


class DeprecatedKeyConflictError(ConfigError, AssertionError):
    """A :class:`ConfigError` whose problems include a deprecated key given together with its replacement.

    It is also an ``AssertionError``: DeepSpeed 0.19.8's config model raises ``AssertionError`` there
    ("Cannot provide deprecated parameter ... and replacing parameter ... together"), and code written
    against it catches that; code that catches ``ConfigError`` or ``ValueError`` catches it too.
    """


DEPRECATED_WITH_REPLACEMENT = "deprecated_with_replacement"
"""The pydantic error type a validator raises (``PydanticCustomError``) for a deprecated key and its replacement."""


def config_error(problems: list[ConfigProblem], source: str | None = None) -> ConfigError:
    """The error for ``problems``: :class:`DeprecatedKeyConflictError` when one of them is such a conflict."""
    conflict = any(p.deprecated_with_replacement for p in problems)
    return (DeprecatedKeyConflictError if conflict else ConfigError)(problems, source)


class ConfigWarning(UserWarning):
    """A config issue that does not stop loading (non-strict mode, ignored keys, deprecated forms)."""
