"""Issue 34, item 6: loading a model through the Python API (as each Ray Serve replica
does) writes no "Loading weights" progress bar to stderr; at aioserve's debug log level
the bar is shown, as ``serve --log-level debug`` shows it."""

from __future__ import annotations

import logging

from aioserve import AsyncEngine, EngineConfig


async def loading_stderr(model_dir: str, capfd) -> str:
    capfd.readouterr()
    async with AsyncEngine(EngineConfig(model=model_dir, device="cpu", num_kv_blocks=16)):
        pass
    return capfd.readouterr().err


async def test_the_python_api_loads_without_a_progress_bar(model_dir, capfd):
    err = await loading_stderr(model_dir, capfd)
    assert "Loading weights" not in err and "it/s]" not in err


async def test_the_bar_shows_at_aioserves_debug_level(model_dir, capfd, caplog):
    caplog.set_level(logging.DEBUG, logger="aioserve")
    assert "Loading weights" in await loading_stderr(model_dir, capfd)
    caplog.set_level(logging.INFO, logger="aioserve")  # and hidden again after
    assert "Loading weights" not in await loading_stderr(model_dir, capfd)
