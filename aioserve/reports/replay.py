"""``simulate --html``: dashboard frames of simulated runs, as one page with a time slider."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aioserve.dashboard import replay_page
from aioserve.dashboard.frames import FrameMaker
from aioserve.engine.observation import StepSnapshot
from aioserve.request import Request

#: Most frames kept per run; longer runs keep every k-th step (and the last).
MAX_FRAMES = 2000


class FrameRecorder:
    """A simulator listener keeping one dashboard frame per step (``label``: the model shown)."""

    def __init__(self, label: str) -> None:
        self.maker = FrameMaker(label)
        self.frames: list[dict[str, Any]] = []

    def on_step(self, snapshot: StepSnapshot) -> None:
        self.frames.append(self.maker.frame(snapshot))

    def on_finish(self, request: Request) -> None:
        self.maker.record_finished(request)

    def kept(self, limit: int = MAX_FRAMES) -> list[dict[str, Any]]:
        """The frames, thinned evenly to at most ``limit`` (the last always kept)."""
        frames = self.frames
        if len(frames) <= limit:
            return frames
        stride = -(-len(frames) // limit)
        thinned = frames[::stride]
        if thinned[-1] is not frames[-1]:
            thinned.append(frames[-1])
        return thinned


def write_html(runs: dict[str, FrameRecorder], path: str | Path, title: str) -> Path:
    """Write the replay of ``runs`` (policy name -> its recorder) to ``path``."""
    path = Path(path)
    page = replay_page({name: rec.kept() for name, rec in runs.items()}, title)
    path.write_text(page, encoding="utf-8")
    return path
