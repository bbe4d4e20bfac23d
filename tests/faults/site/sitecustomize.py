"""Installs the tests' faults in each Python process started with this folder on PYTHONPATH.

Python imports `sitecustomize` as it starts. This one imports nothing of Strata then:
Spark's Python daemon must fork its workers before any library that may start threads
is imported. It waits for the process to import `strata.faults`, and right after that
module runs installs the faults the process's environment arms
(`tests.faults.install_from_env`). Wherever the seam is imported (the `strata` command,
spark-submit's driver, a Spark Python worker), the faults are in place before any code
reaches a point.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType
from typing import Any

SEAM = "strata.faults"
# The checkout, for `tests.faults`: appended, so it shadows nothing the process imports.
ROOT = str(Path(__file__).resolve().parents[3])


class InstallOnImport(importlib.abc.MetaPathFinder):
    """Finds `strata.faults` as the other finders would, with a loader that installs after."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname != SEAM:
            return None
        # Once per process; and out of the way of the search below.
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = InstallAfter(spec.loader)
        return spec


class InstallAfter(importlib.abc.Loader):
    """The seam's own loader, then the faults installed into the module it ran."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def __getattr__(self, name: str) -> Any:
        # `get_source` and the like, for tracebacks through the seam.
        return getattr(self._loader, name)

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        if ROOT not in sys.path:
            sys.path.append(ROOT)
        from tests.faults import install_from_env

        install_from_env()


sys.meta_path.insert(0, InstallOnImport())
