"""Helpers of the engine plug-in tests: the entry point as the engines' loaders see it, and
the environment of one case."""

from __future__ import annotations

import importlib.metadata
from contextlib import contextmanager

import pytest

VALUES = {"vllm.general_plugins": "sempar.eplb.vllm_plugin:register",
          "sglang.srt.plugins": "sempar.eplb.sglang_plugin:register"}


@contextmanager
def sempar_entry_point(group: str, patch_module=None):
    """Yield with an entry point `sempar` in `group` visible to `importlib.metadata`.

    Installed metadata (pip install -e .) has it; a checkout whose installed metadata predates
    the entry points (the shared dev venv) gets the same EntryPoint added to what
    `entry_points(group=...)` returns, and the engine's own loader is what is called."""
    found = [ep for ep in importlib.metadata.entry_points(group=group) if ep.name == "sempar"]
    if found:
        assert found[0].value == VALUES[group], found[0].value
        yield
        return
    real = importlib.metadata.entry_points
    ep = importlib.metadata.EntryPoint("sempar", VALUES[group], group)

    def entry_points(**kw):
        eps = real(**kw)
        if kw.get("group") == group:
            return importlib.metadata.EntryPoints([*eps, ep])
        return eps

    mp = pytest.MonkeyPatch()
    mp.setattr(importlib.metadata, "entry_points", entry_points)
    if patch_module is not None:
        mp.setattr(patch_module, "entry_points", entry_points)
    try:
        yield
    finally:
        mp.undo()


@contextmanager
def env(**values):
    """os.environ with `values` set (None: removed), restored after."""
    mp = pytest.MonkeyPatch()
    for k, v in values.items():
        if v is None:
            mp.delenv(k, raising=False)
        else:
            mp.setenv(k, str(v))
    try:
        yield
    finally:
        mp.undo()
