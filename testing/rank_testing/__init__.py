"""Test-only helpers shared by the packages' test suites (not shipped in any package).

The root ``conftest.py`` puts ``testing/`` on ``sys.path``, so ``from rank_testing import spawn`` works in
every package's tests, including the per-package nox sessions that install one package alone.
"""

from rank_testing.dist import free_port, spawn

__all__ = ["free_port", "spawn"]
