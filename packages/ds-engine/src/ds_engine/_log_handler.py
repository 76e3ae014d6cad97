"""The handler ``initialize()`` gives the ``ds_engine`` logger: log lines go above a progress bar."""

from __future__ import annotations

import logging
import sys

__all__ = ["AboveProgressBars"]


class AboveProgressBars(logging.StreamHandler):
    """A StreamHandler that writes through ``tqdm.write`` once tqdm is in use.

    A tqdm bar keeps its line open (it redraws after ``\\r``), so a plain write lands inside it;
    ``tqdm.write`` clears the bars on the stream, writes the line and redraws them below it. Before
    tqdm is imported no bar can exist, and tqdm is not imported for it.
    """

    def emit(self, record: logging.LogRecord) -> None:
        tqdm_module = sys.modules.get("tqdm")
        if tqdm_module is None:
            super().emit(record)
            return
        try:
            tqdm_module.tqdm.write(self.format(record), file=self.stream)
            self.flush()
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)
