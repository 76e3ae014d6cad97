"""Run examples/train_gpt.py as ``__main__`` so ``conftest.launch()`` can start it on every rank."""

import runpy
from pathlib import Path

runpy.run_path(str(Path(__file__).resolve().parents[2] / "examples" / "train_gpt.py"), run_name="__main__")
