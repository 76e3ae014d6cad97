"""Hostfile parsing and include/exclude/num_* selection against DeepSpeed's rules and error texts."""

from __future__ import annotations

import pytest
from ds_launch import HostfileError, filter_resources, parse_hostfile, parse_hostfile_lines, select_resources

GOOD = [
    ("worker-0 slots=4\nworker-1 slots=2\n", {"worker-0": 4, "worker-1": 2}),
    ("# comment\n\n  worker-0   slots=8  \n", {"worker-0": 8}),
    ("worker-0 slots=4 max_slots=8\n", {"worker-0": 4}),  # Open MPI trailing fields are tolerated
    ("10.0.0.2 slots=1\n10.0.0.1 slots=1\n", {"10.0.0.2": 1, "10.0.0.1": 1}),
]


@pytest.mark.parametrize(("text", "expected"), GOOD)
def test_good_hostfiles(text, expected):
    pool = parse_hostfile_lines(text.splitlines())
    assert pool == expected
    assert list(pool) == list(expected)  # order fixes global ranks


BAD = [
    (
        "worker-0 slots=4\nworker-1 slot=4\n",
        "Hostfile contains a bad entry: worker-1 slot=4, unable to proceed with launching (hf line 2;",
    ),
    ("worker-0\n", "Hostfile contains a bad entry: worker-0, unable to proceed with launching (hf line 1;"),
    (
        "worker-0 slots=4x\n",
        "Hostfile contains a bad entry: worker-0 slots=4x, unable to proceed with launching (hf line 1;",
    ),
    ("slots=4\n", "Hostfile contains a bad entry: slots=4, unable to proceed with launching (hf line 1;"),
    (
        "a slots=1\n# c\na slots=2\n",
        "Hostfile contains multiple entries for a, unable to proceed with launching (hf lines 1 and 3: 'a slots=2';",
    ),
    ("# only a comment\n\n", "Hostfile is empty or not formatted correctly"),
    ("", "Hostfile is empty or not formatted correctly"),
]


@pytest.mark.parametrize(("text", "message"), BAD)
def test_bad_hostfiles_quote_the_line(text, message):
    with pytest.raises(HostfileError) as info:
        parse_hostfile_lines(text.splitlines(), source="hf")
    assert message in str(info.value)
    assert isinstance(info.value, ValueError)  # DeepSpeed raises ValueError; callers catching it still work


def test_parse_hostfile_reads_a_file_and_names_it(tmp_path):
    path = tmp_path / "hostfile"
    path.write_text("a slots=2\nb slots=x\n")
    with pytest.raises(HostfileError, match=rf"{path} line 2"):
        parse_hostfile(path)
    with pytest.raises(HostfileError, match="does not exist"):
        parse_hostfile(tmp_path / "missing")


HOSTS = {"worker-0": [0, 1, 2, 3], "worker-1": [0, 1, 2, 3], "worker-2": [0, 1]}

FILTERS = [
    ("", "", HOSTS),
    ("worker-1", "", {"worker-1": [0, 1, 2, 3]}),
    ("worker-1:0,2", "", {"worker-1": [0, 2]}),
    ("worker-2@worker-0:1", "", {"worker-0": [1], "worker-2": [0, 1]}),  # hostfile order, not spec order
    ("worker-0:3,1,1", "", {"worker-0": [1, 3]}),  # sorted, duplicates removed
    ("worker-0:0@worker-0:2", "", {"worker-0": [0, 2]}),  # a host named twice adds up
    ("", "worker-1", {"worker-0": [0, 1, 2, 3], "worker-2": [0, 1]}),
    ("", "worker-0:0,1@worker-2:0", {"worker-0": [2, 3], "worker-1": [0, 1, 2, 3], "worker-2": [1]}),
    ("", "worker-2:0,1", {"worker-0": [0, 1, 2, 3], "worker-1": [0, 1, 2, 3]}),  # emptied host dropped
    ("", "worker-0:1@worker-0:1", {"worker-0": [0, 2, 3], "worker-1": [0, 1, 2, 3], "worker-2": [0, 1]}),
]


@pytest.mark.parametrize(("include", "exclude", "expected"), FILTERS)
def test_include_exclude(include, exclude, expected):
    result = filter_resources(HOSTS, include, exclude)
    assert result == expected
    assert list(result) == list(expected)


FILTER_ERRORS = [
    ("worker-0", "worker-1", "include_str and exclude_str are mutually exclusive."),
    ("worker-9", "", "Hostname 'worker-9' not found in hostfile"),
    ("", "worker-9:0", "Hostname 'worker-9' not found in hostfile"),
    ("worker-2:5", "", "No slot '5' specified on host 'worker-2'"),
    ("", "worker-2:0,7", "No slot '7' specified on host 'worker-2'"),
    ("worker-0:a", "", "Bad slot list in 'worker-0:a'"),
    ("worker-0@", "", "Hostname '' not found in hostfile"),
]


@pytest.mark.parametrize(("include", "exclude", "message"), FILTER_ERRORS)
def test_include_exclude_errors(include, exclude, message):
    with pytest.raises(HostfileError) as info:
        filter_resources(HOSTS, include, exclude)
    assert message in str(info.value)


POOL = {"worker-0": 4, "worker-1": 4, "worker-2": 2}

SELECTIONS = [
    ({}, {"worker-0": [0, 1, 2, 3], "worker-1": [0, 1, 2, 3], "worker-2": [0, 1]}),
    ({"num_nodes": 2}, {"worker-0": [0, 1, 2, 3], "worker-1": [0, 1, 2, 3]}),
    ({"num_procs": 2}, {"worker-0": [0, 1], "worker-1": [0, 1], "worker-2": [0, 1]}),
    ({"num_nodes": 1, "num_procs": 3}, {"worker-0": [0, 1, 2]}),
    ({"include": "worker-1:2"}, {"worker-1": [2]}),
]


@pytest.mark.parametrize(("kwargs", "expected"), SELECTIONS)
def test_select_resources(kwargs, expected):
    assert select_resources(POOL, **kwargs) == expected


SELECTION_ERRORS = [
    ({"include": "worker-0", "num_procs": 1}, "Cannot specify num_nodes/gpus with include/exclude"),
    ({"exclude": "worker-0", "num_nodes": 1}, "Cannot specify num_nodes/gpus with include/exclude"),
    ({"num_nodes": 2, "have_hostfile": False}, "Num nodes is >1 but no extra nodes available via hostfile"),
    ({"num_nodes": 5}, "--num_nodes 5 asks for more hosts than the 3 available"),
    ({"num_procs": 0}, "--num_procs must be a positive number"),
    ({"exclude": "worker-0@worker-1@worker-2"}, "No slots left"),
]


@pytest.mark.parametrize(("kwargs", "message"), SELECTION_ERRORS)
def test_select_resources_errors(kwargs, message):
    with pytest.raises(HostfileError) as info:
        select_resources(POOL, **kwargs)
    assert message in str(info.value)
