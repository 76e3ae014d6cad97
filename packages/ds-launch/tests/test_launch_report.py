"""Which rank the report names first, from rank records and the exits the launcher saw."""

from __future__ import annotations

from ds_launch._report import ProcessExit, first_failure, mpi_runtime_signals, rank_ends, report

STOP = 1_000


def test_a_record_taken_before_teardown_beats_an_earlier_exit():
    # rank 2 recorded code 3 at t=100 and was still in teardown when rank 1, which lost it, exited at t=150
    events = {2: {"rank": 2, "code": 3, "t_ns": 100}}
    exits = {0: ProcessExit(1_200, -15), 1: ProcessExit(150, 1), 2: ProcessExit(1_100, -15)}
    ends = rank_ends(3, events, exits, STOP, job_failed=True)
    first = first_failure(ends)
    assert (first.rank, first.how, first.code) == (2, "exited with code 3", 3)
    lines = report(ends, lambda rank: [f"rank {rank} says bye"])
    assert lines[0] == "rank 2 exited with code 3: the first rank to fail."
    assert lines[2] == "  | rank 2 says bye"
    assert lines[3] == "Then: rank 1 exited with code 1."
    assert lines[4] == "Stopped by ds-launch because of it: rank 0 (was killed by signal SIGTERM (15))."
    # what the ranks said they are (ds_launch.set_rank_role) goes beside them
    roles = {0: "pipeline stage 0 of 2", 2: "pipeline stage 1 of 2"}
    lines = report(ends, lambda rank: [f"rank {rank} says bye"], roles=roles)
    assert lines[0] == "rank 2 [pipeline stage 1 of 2] exited with code 3: the first rank to fail."
    assert lines[3] == "Then: rank 1 exited with code 1."
    assert lines[4] == (
        "Stopped by ds-launch because of it: rank 0 [pipeline stage 0 of 2] (was killed by signal SIGTERM (15))."
    )


def test_a_rank_that_lost_a_peer_is_named_after_one_that_failed_on_its_own():
    events = {1: {"rank": 1, "code": 1, "t_ns": 90, "peer_lost": True, "traceback": ["RuntimeError: closed"]}}
    exits = {0: ProcessExit(STOP + 5, -15), 1: ProcessExit(95, 1), 2: ProcessExit(120, -9)}
    first = first_failure(rank_ends(3, events, exits, STOP, job_failed=True))
    assert (first.rank, first.how) == (2, "was killed by signal SIGKILL (9)")


def test_under_mpirun_its_signal_message_names_a_rank_without_a_record():
    said = mpi_runtime_signals(
        ["prterun noticed that process rank 2 with PID 12275 on node vm exited on", "signal 9 (Killed)."]
    )
    assert said == {2: -9}
    events = {r: {"rank": r, "code": 1, "t_ns": 50 + r, "peer_lost": True} for r in (1, 3)}
    ends = rank_ends(4, events, {}, None, job_failed=True, runtime_said=said)
    first = first_failure(ends)
    assert (first.rank, first.code) == (2, -9)
    assert ends[0].how.startswith("ended without a record")  # rank 0: stopped by mpirun, probably


def test_a_sigkill_the_launcher_did_not_send_is_the_rank_s_own_failure_even_when_timed_late():
    # rank 2 was SIGKILLed (by itself, or the OOM killer) before its peers noticed; on a loaded machine
    # its reaper reported it after rank 1's exit had made the launcher start stopping (SIGTERM first)
    events = {1: {"rank": 1, "code": 1, "t_ns": 90, "peer_lost": True, "traceback": ["RuntimeError: reset"]}}
    exits = {0: ProcessExit(STOP + 5, -15), 1: ProcessExit(95, 1), 2: ProcessExit(STOP + 2, -9)}
    kill = STOP + 2_000  # the launcher's own SIGKILL, after the grace period
    first = first_failure(rank_ends(3, events, exits, STOP, job_failed=True, kill_t_ns=kill))
    assert (first.rank, first.how) == (2, "was killed by signal SIGKILL (9)")
    # a SIGKILL after the launcher sent its own is the launcher's
    exits[2] = ProcessExit(kill + 1, -9)
    ends = rank_ends(3, events, exits, STOP, job_failed=True, kill_t_ns=kill)
    assert not ends[2].failed and first_failure(ends).rank == 1


def test_config_errors_are_shown_once_per_message_naming_the_ranks_without_tracebacks():
    bad = "1 problem in DeepSpeed config (ds.json):\n  - train_batch_size = 10: not 3 * 1 * 2"
    other = "1 problem in DeepSpeed config (ds.json):\n  - fp16.loss_scale = -1: must be >= 0"
    tb = ["Traceback (most recent call last):\n", "ds_config._errors.ConfigError: ...\n"]
    events = {
        r: {"rank": r, "code": 1, "t_ns": 100 + r, "traceback": tb, "config_error": text}
        for r, text in ((0, bad), (1, other), (2, bad))
    }
    exits = {r: ProcessExit(200 + r, 1) for r in range(3)} | {3: ProcessExit(STOP + 5, -15)}
    lines = report(rank_ends(4, events, exits, STOP, job_failed=True), lambda rank: ["a stderr line"])
    assert lines == [
        "ranks 0 and 2 raised ConfigError (exit code 1):",
        "  | 1 problem in DeepSpeed config (ds.json):",
        "  |   - train_batch_size = 10: not 3 * 1 * 2",
        "rank 1 raised ConfigError (exit code 1):",
        "  | 1 problem in DeepSpeed config (ds.json):",
        "  |   - fp16.loss_scale = -1: must be >= 0",
        "Stopped by ds-launch because of it: rank 3 (was killed by signal SIGTERM (15)).",
    ]
