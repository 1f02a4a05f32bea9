"""The public surfaces of lab.history and lab.generator: everything in __all__ exists and is documented."""

from __future__ import annotations

import importlib
import inspect

import pytest

MODULES = [
    "lab.history", "lab.history.ops", "lab.history.writer", "lab.history.files", "lab.history.edn",
    "lab.history.frame", "lab.generator", "lab.generator.core", "lab.generator.context",
    "lab.generator.interpreter", "lab.generator.simulate", "lab.generator.protocols",
]  # fmt: skip


@pytest.mark.parametrize("name", MODULES)
def test_public_names_exist_and_have_docstrings(name):
    module = importlib.import_module(name)
    assert module.__doc__ and len(module.__doc__.strip()) > 40, f"{name} needs a module docstring explaining the idea"
    for attr in module.__all__:
        obj = getattr(module, attr)  # raises if __all__ lists something missing
        if inspect.isfunction(obj) or inspect.isclass(obj):
            assert inspect.getdoc(obj), f"{name}.{attr} has no docstring"
