"""Keep TensorFlow's native start-up lines off every rank's output.

``TF_CPP_MIN_LOG_LEVEL`` hides most of them, but on CPUs where oneDNN is on by default TF
2.21 still prints "oneDNN custom operations are on" (and absl's "before
absl::InitializeLog()" notice) from libraries that ignore it. :func:`install` silences file
descriptor 2 while the ``tensorflow`` package itself is being imported, and only then (a
Python error from the import is raised after stderr is back)."""
from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys


class _Silenced(importlib.abc.Loader):
    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        sys.stderr.flush()
        saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        try:
            self.loader.exec_module(module)
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            os.close(devnull)


class _QuietTensorFlow(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "tensorflow":
            return None
        sys.meta_path.remove(self)   # once; and so find_spec below finds the real one
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _Silenced(spec.loader)
        return spec


def install() -> None:
    """Silence TensorFlow's import (a no-op once it is imported)."""
    if "tensorflow" not in sys.modules and not any(
            isinstance(f, _QuietTensorFlow) for f in sys.meta_path):
        sys.meta_path.insert(0, _QuietTensorFlow())


def uninstall() -> None:
    """Let TensorFlow's import print again (``hetgrad --verbose``)."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _QuietTensorFlow)]
