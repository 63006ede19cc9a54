"""The request pipeline stays short: from each handler (completions, chat, the websocket)
to ``AsyncEngine.add_request``, one real request enters at most 6 project modules (the
engine's count as one) and changes form at most 4 times (request_path_support.py,
``sys.setprofile``; structural, not timed)."""

from __future__ import annotations

import pytest
from request_path_support import trace


@pytest.mark.parametrize("kind", ["completions", "chat", "websocket"])
async def test_the_path_to_the_engine_is_short(kind, model_dir):
    path = await trace(kind, model_dir)
    assert path.modules[0].startswith("aioserve.server"), path
    assert path.modules[-1] == "aioserve.engine", path  # the request reached the engine
    assert len(path.modules) <= 6, path.modules
    assert path.form_changes <= 4, path.forms
    assert path.forms[max(path.forms)] == ["RequestStream"], path.forms
