"""Lazy package attributes: `import minipar` stays light, and a name loads its module (and so
torch, numpy or mpi4py) the first time someone uses it.

    __getattr__, __dir__ = lazy.attributes(__name__, {"DeviceMesh": "minipar.parallel.mesh"})
"""

from __future__ import annotations

import importlib
import sys


def attributes(package: str, names: dict, submodules=()):
    """A module's `__getattr__` and `__dir__` (PEP 562): `names` maps an attribute to the module
    that defines it (looked up once, then cached in the package), `submodules` are imported on
    first access. `dir()` lists the package's `__all__` (else these names)."""
    submodules = frozenset(submodules)
    listed = sorted(names) + sorted(submodules)

    def __getattr__(name: str):
        if name in names:
            value = getattr(importlib.import_module(names[name]), name)
            setattr(sys.modules[package], name, value)
            return value
        if name in submodules:
            return importlib.import_module(f"{package}.{name}")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__():
        return getattr(sys.modules[package], "__all__", listed)

    return __getattr__, __dir__
