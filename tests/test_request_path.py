"""The request pipeline stays short: from each handler (completions, chat, the websocket)
to ``AsyncEngine.add_request``, one real request enters at most 6 project modules (the
engine's count as one) and changes form at most 4 times (benchmarks/request_path.py,
``sys.setprofile``; structural, not timed)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "request_path.py"


def _request_path():
    spec = importlib.util.spec_from_file_location("request_path", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["request_path"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("kind", ["completions", "chat", "websocket"])
async def test_the_path_to_the_engine_is_short(kind, model_dir):
    path = await _request_path().trace(kind, model_dir)
    assert path.modules[0].startswith("aioserve.server"), path
    assert path.modules[-1] == "aioserve.engine", path  # the request reached the engine
    assert len(path.modules) <= 6, path.modules
    assert path.form_changes <= 4, path.forms
    assert path.forms[max(path.forms)] == ["RequestStream"], path.forms
