"""The one parser of ds's DS_* environment variables: flags, choices, numbers; a bad value names itself."""

from __future__ import annotations

import pytest
from ds_config import EnvironmentVariableError, env_choice, env_flag, env_number


@pytest.mark.parametrize("value", ["1", "true", "YES", " on "])
def test_flag_on(value):
    assert env_flag("DS_X", False, {"DS_X": value}) is True


@pytest.mark.parametrize("value", ["0", "False", "no", "OFF"])
def test_flag_off(value):
    assert env_flag("DS_X", True, {"DS_X": value}) is False


def test_unset_or_empty_is_the_default():
    assert env_flag("DS_X", True, {}) is True and env_flag("DS_X", False, {"DS_X": " "}) is False
    assert env_choice("DS_X", ("a", "b"), "b", {}) == "b" and env_number("DS_X", 64, {"DS_X": ""}) == 64


def test_a_value_it_does_not_accept_names_the_variable_and_what_it_accepts():
    with pytest.raises(EnvironmentVariableError, match=r"DS_X='maybe' is neither on \(1, true, yes, on\)"):
        env_flag("DS_X", True, {"DS_X": "maybe"})
    with pytest.raises(EnvironmentVariableError, match="DS_X='c' is not one of a, b"):
        env_choice("DS_X", ("a", "b"), "a", {"DS_X": "c"})
    with pytest.raises(EnvironmentVariableError, match="DS_X='lots' is not a number"):
        env_number("DS_X", 1, {"DS_X": "lots"})
    assert issubclass(EnvironmentVariableError, ValueError)


def test_reads_the_process_environment_by_default(monkeypatch):
    monkeypatch.setenv("DS_X", "a")
    assert env_choice("DS_X", ("a", "b"), "b") == "a"
    monkeypatch.setenv("DS_X", "2.5")
    assert env_number("DS_X", 1) == 2.5
