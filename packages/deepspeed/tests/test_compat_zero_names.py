"""ZeRO names code reaches into, at 2 gloo ranks, against DeepSpeed 0.19.8's record.

``fixtures/deepspeed_compat.json`` ("zero_names") holds what ``zero_names_case``
(``tools/fixtures/deepspeed_compat_cases.py``, run by ``tools/fixtures/make_deepspeed_compat_fixtures.py``)
returned on each rank under the real DeepSpeed: a stage-3
parameter's shape (``partitioned_param_data_shape``), ``ds_shape`` and ``ds_tensor`` around
``GatheredParameters`` with a modifier rank, a parent initialising its child's weight in ``__init__`` under
``zero.Init``, ``_external_params`` and ``unregister_external_parameter``, ``deepspeed.runtime.zero.utils`` and
``MultipleAllGatherHandles.wait``'s keyword. The same function runs here under ds; results must be equal.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rank_testing import spawn

RECORD = json.loads((Path(__file__).parent / "fixtures/deepspeed_compat.json").read_text())["zero_names"]
FIXTURES = str(Path(__file__).resolve().parents[3] / "tools/fixtures")


def _case(rank: int, world_size: int) -> dict:
    sys.path.insert(0, FIXTURES)
    from deepspeed_compat_cases import zero_names_case

    return zero_names_case(rank, world_size)


def test_zero_names_as_deepspeed_0_19_8():
    got = json.loads(json.dumps(spawn(_case, 2, timeout_s=240)))  # tuples as the record has them: lists
    for rank in (0, 1):
        for key, want in RECORD[rank].items():
            assert got[rank].get(key) == want, (rank, key, got[rank].get(key), want)
