"""DeepSpeed's training monitors (``csv_monitor``, ``tensorboard``): the same events, files and folders.

The engine calls ``write_events`` with DeepSpeed's ``(name, value, samples)`` tuples: after each
optimizer step ``Train/Samples/lr`` (and ``Train/Samples/loss_scale`` under fp16), and at each boundary
backward ``Train/Samples/train_loss``. Only global rank 0 writes, into ``output_path/job_name`` as DeepSpeed.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any

from ds_config import DSConfig

__all__ = ["Monitor"]

Event = tuple[str, float, int]


class _CsvWriter:
    """One ``<name with / as _>.csv`` per event, header ``step,<last part of the name>`` (DeepSpeed's layout)."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        log_dir.mkdir(parents=True, exist_ok=True)
        self._started: set[str] = set()

    def write(self, events: list[Event]) -> None:
        for name, value, step in events:
            filename = name.replace("/", "_").replace(" ", "_")
            with open(self.log_dir / f"{filename}.csv", "a+", newline="") as out:
                writer = csv.writer(out)
                if filename not in self._started:
                    self._started.add(filename)
                    writer.writerow(["step", name.split("/")[-1]])
                writer.writerow([step, value])

    def close(self) -> None:
        pass


class _TensorBoardWriter:
    """Scalars through ``torch.utils.tensorboard.SummaryWriter`` (needs the ``tensorboard`` package)."""

    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        log_dir.mkdir(parents=True, exist_ok=True)
        self.summary_writer = SummaryWriter(log_dir=str(log_dir))

    def write(self, events: list[Event]) -> None:
        for name, value, step in events:
            self.summary_writer.add_scalar(name, value, step)
        self.summary_writer.flush()

    def close(self) -> None:
        self.summary_writer.close()


class Monitor:
    """The enabled writers of one rank (none except on global rank 0)."""

    def __init__(self, writers: list[Any]) -> None:
        self.writers = writers

    @classmethod
    def from_config(cls, cfg: DSConfig, rank: int) -> Monitor:
        writers: list[Any] = []
        if cfg.tensorboard.enabled:
            _require_tensorboard()  # on every rank, so no rank trains on while rank 0 fails
        if rank == 0:
            if cfg.csv_monitor.enabled:
                writers.append(_CsvWriter(_log_dir(cfg.csv_monitor)))
            if cfg.tensorboard.enabled:
                writers.append(_TensorBoardWriter(_log_dir(cfg.tensorboard)))
        return cls(writers)

    @property
    def enabled(self) -> bool:
        return bool(self.writers)

    def write_events(self, events: list[Event]) -> None:
        for writer in self.writers:
            writer.write(events)

    def close(self) -> None:
        for writer in self.writers:
            writer.close()


def _require_tensorboard() -> None:
    try:
        import tensorboard  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            'the config enables "tensorboard", which needs the tensorboard package: pip install tensorboard '
            '(or pip install "ds-engine[tensorboard]") '
            '-- or set "tensorboard": {"enabled": false}'
        ) from exc


def _log_dir(section: Any) -> Path:
    return Path(os.path.join(section.output_path, section.job_name))
