"""Make the shared test helpers in testing/ importable from every test suite."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "testing"))
