"""The one 2-rank launch that test_dropin_ranks.py and test_engine_step_guard.py read (a launch costs seconds,
their checks milliseconds)."""

from __future__ import annotations

from pathlib import Path

import pytest
from rank_testing import spawn


@pytest.fixture(scope="session")
def ranks(tmp_path_factory) -> tuple[list[dict], Path]:
    """Each rank's results of ``test_dropin_ranks._all_checks``, and the folder its checkpoints went to."""
    from test_dropin_ranks import _all_checks

    root = tmp_path_factory.mktemp("ranks")
    (root / "own").mkdir()
    return spawn(_all_checks, 2, str(root)), root
