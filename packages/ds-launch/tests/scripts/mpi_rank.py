"""A rank that asks mpi4py where it is (no torch: fast), as init_distributed does."""

import json
import sys
from pathlib import Path

from ds_launch._mpi_discovery import mpi_world

_, world = mpi_world()
Path(sys.argv[1], f"rank{world.rank}.json").write_text(
    json.dumps(
        {
            "rank": world.rank,
            "world_size": world.world_size,
            "local_rank": world.local_rank,
            "local_world_size": world.local_world_size,
            "hostnames": list(world.hostnames),
            "argv": sys.argv[2:],
        }
    )
)
