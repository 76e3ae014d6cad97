"""``python -m ds_config explain|validate cfg.json [--world-size N]``."""

import sys

from ._cli import main

sys.exit(main())
