"""The one exception type for configuration problems, and the warning category."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_NO_VALUE = object()


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

    def __str__(self) -> str:
        if self.value is _NO_VALUE:
            return f"{self.path}: {self.message}"
        return f"{self.path} = {_short_repr(self.value)}: {self.message}"


def _short_repr(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ConfigError(ValueError):
    """Every problem found in a DeepSpeed config, reported at once.

    ``problems`` holds one :class:`ConfigProblem` per problem; ``str(error)`` lists them all.
    """

    def __init__(
        self, problems: list[ConfigProblem], source: str | None = None, hint: str | None = None
    ) -> None:
        if not problems:
            raise ValueError("ConfigError needs at least one problem")
        self.problems = list(problems)
        self.source = source
        self.hint = hint
        super().__init__(self._render())

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


class ConfigWarning(UserWarning):
    """A config issue that does not stop loading (non-strict mode, ignored keys, deprecated forms)."""
