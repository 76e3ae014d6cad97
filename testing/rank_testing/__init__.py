"""Test-only helpers shared by the packages' test suites (not shipped in any package).

The root ``conftest.py`` puts ``testing/`` on ``sys.path``, so ``from rank_testing import spawn`` works in
every package's tests, including the per-package nox sessions that install one package alone.
"""

from rank_testing.dist import free_port, spawn
from rank_testing.memory import live_storage_bytes

__all__ = ["free_port", "live_storage_bytes", "spawn"]
