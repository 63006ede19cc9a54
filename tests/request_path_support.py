"""The path of one request from its server handler to ``AsyncEngine.add_request``: the
project modules it enters (the engine's modules count as one room) and the forms the
request takes on the way, measured with ``sys.setprofile`` on one real request against
the tiny model (aiohttp's test server on 127.0.0.1).

A form is the type of a value made from the request: the body's bytes (or the websocket
message's text) are generation 0, and a value returned by (or built in) a call that was
handed a value of generation g is of generation g + 1; a value that wraps what a call it
made returned comes after it. The trace ends when the stream ``add_request`` returned is
back in the handler's module. Prints, for the completion and chat routes and the
websocket, the modules, the number of stays (runs of calls in one module) and the forms
by generation; asserts nothing (``tests/test_request_path.py`` asserts the bounds).

Alone (from the repository root): ``PYTHONPATH=. python3 tests/request_path_support.py
[--model PATH]``
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

REPO = Path(__file__).resolve().parents[1]
MODEL = str(REPO.parent / "shared" / "models" / "stories260K-hf")
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
#: The engine's modules (a package after the engine moved, top-level files before).
ENGINE_MODULES = ("engine", "engine_core", "engine_queues", "engine_readouts", "step_loop",
                  "delivery", "streams", "delta_queue", "batch_builder", "listeners")
#: The handler each route's trace starts at: (module, function name).
HANDLERS = {
    "completions": ("aioserve.server.openai.completions", "create_completion"),
    "chat": ("aioserve.server.openai.chat", "create_chat_completion"),
    "websocket": ("aioserve.server.ws.websocket", "on_text"),
}


def room(module: str) -> str:
    """The room a module belongs to: the engine's modules are one, ``aioserve.engine``."""
    parts = module.split(".")
    if parts[0] == "aioserve" and len(parts) > 1 and parts[1] in ENGINE_MODULES:
        return "aioserve.engine"
    return module


@dataclass
class Path_:
    """What one traced request went through."""

    modules: list[str] = field(default_factory=list)
    stays: int = 0
    forms: dict[int, list[str]] = field(default_factory=dict)

    @property
    def form_changes(self) -> int:
        return max(self.forms) if self.forms else 0


class Tracer:
    """A ``sys.setprofile`` hook following one request in its handler's task."""

    def __init__(self, handler: tuple[str, str]) -> None:
        self.handler = handler
        self.task: asyncio.Task[Any] | None = None
        self.handler_frame: types.FrameType | None = None
        self.path = Path_()
        self.last_module: str | None = None
        self.gen: dict[int, tuple[int, Any]] = {}  # id -> (generation, value)
        self.frame_gen: dict[types.FrameType, int] = {}
        self.child_gen: dict[types.FrameType, int] = {}
        self.body_text: str | None = None
        self.engine_frame: types.FrameType | None = None
        self.returned = False
        self.done = False

    def _track(self, value: Any, generation: int) -> None:
        self.gen[id(value)] = (generation, value)
        if isinstance(value, (bytes, str)) and generation == 0:  # the body
            self.body_text = value.decode("utf-8", "replace") if isinstance(
                value, bytes) else value
        if _recordable(value) or generation == 0:
            names = self.path.forms.setdefault(generation, [])
            if type(value).__name__ not in names:
                names.append(type(value).__name__)

    def _of(self, value: Any) -> int | None:
        held = self.gen.get(id(value))
        if held is not None and held[1] is value:
            return held[0]
        if isinstance(value, str) and self.body_text is not None and value == self.body_text:
            return 0  # the body decoded: the same data
        return None

    def _enter(self, module: str) -> None:
        if not module.startswith("aioserve"):
            return
        name = room(module)
        if name not in self.path.modules:
            self.path.modules.append(name)
        if name != self.last_module:
            self.path.stays += 1
            self.last_module = name

    def __call__(self, frame: types.FrameType, event: str, arg: Any) -> None:
        if self.done or event not in ("call", "return"):
            return
        code = frame.f_code
        module = frame.f_globals.get("__name__", "")
        if self.task is None:
            if event == "call" and (module, code.co_name) == self.handler:
                self.task = asyncio.current_task()
                self.handler_frame = frame
                for name in code.co_varnames[: code.co_argcount]:
                    if isinstance(frame.f_locals.get(name), str):  # a websocket message
                        self._track(frame.f_locals[name], 0)
            else:
                return
        if asyncio.current_task() is not self.task:
            return
        if self.engine_frame is not None:  # inside add_request: not followed
            if frame is self.engine_frame and event == "return":
                self._track(arg, self.frame_gen.get(frame, 0) + 1)
                self._returned_into(frame.f_back, arg)
                self.engine_frame = None
                self.returned = True
            return
        if event == "call":
            self._enter(module)
            if code.co_name == "add_request" and room(module) == "aioserve.engine":
                self.engine_frame = frame
            self._call(frame)
        else:
            self._return(frame, arg)
            caller = frame.f_back
            if self.returned and caller is not None and caller.f_globals.get(
                    "__name__") == self.handler[0]:
                self.done = True  # the stream is back in the handler's module

    def _call(self, frame: types.FrameType) -> None:
        if frame in self.frame_gen:
            return  # a coroutine resumed
        code = frame.f_code
        names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
        found = [g for g in (self._of(frame.f_locals.get(n)) for n in names) if g is not None]
        parent = frame.f_back  # a constructor builds what its caller makes
        if code.co_name == "__init__" and parent is not None and parent in self.frame_gen:
            found.append(self.frame_gen[parent])
        if found:
            self.frame_gen[frame] = max(found)

    def _return(self, frame: types.FrameType, value: Any) -> None:
        code = frame.f_code
        if code.co_name == "read" and frame.f_globals.get("__name__", "").startswith(
                "aiohttp") and isinstance(value, bytes) and value:
            self._track(value, 0)
        base = max(self.frame_gen.get(frame, -1), self.child_gen.get(frame, -1))
        if base >= 0 and code.co_name == "__init__" and "self" in frame.f_locals:
            made = frame.f_locals["self"]
            if self._of(made) is None and _recordable(made):
                self._track(made, base + 1)
        if base >= 0 and value is not None and self._of(value) is None and _recordable(value):
            self._track(value, base + 1)
        self._returned_into(frame.f_back, value)

    def _returned_into(self, caller: types.FrameType | None, value: Any) -> None:
        generation = self._of(value)
        if caller is not None and generation is not None:
            self.child_gen[caller] = max(self.child_gen.get(caller, -1), generation)


def _recordable(value: Any) -> bool:
    kind = type(value)
    return kind in (bytes, dict) or isinstance(value, BaseModel) or (
        kind.__module__.startswith("aioserve") and not isinstance(value, BaseException))


async def _send(kind: str, client: Any) -> None:
    body: dict[str, Any] = {"max_tokens": 4, "temperature": 0}
    if kind == "completions":
        response = await client.post("/v1/completions", json={"prompt": "Once upon", **body})
        assert response.status == 200, await response.text()
    elif kind == "chat":
        response = await client.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "Once upon"}], **body})
        assert response.status == 200, await response.text()
    else:
        async with client.ws_connect("/ws") as ws:
            await ws.send_json({"type": "generate", "id": "a", "prompt": "Once upon", **body})
            while (await ws.receive_json())["type"] == "token":
                pass


async def trace(kind: str, model: str = MODEL) -> Path_:
    """The path of one ``kind`` request (``completions``, ``chat``, ``websocket``)."""
    from aiohttp.test_utils import TestClient, TestServer

    from aioserve import AsyncEngine, EngineConfig
    from aioserve.server import ServerConfig, create_app

    engine = AsyncEngine(EngineConfig(model=model, num_kv_blocks=64))
    app = create_app(engine, ServerConfig(chat_template=CHAT_TEMPLATE))
    async with TestClient(TestServer(app, host="127.0.0.1", port=0)) as client:
        await _send(kind, client)  # warm: imports and caches out of the trace
        tracer = Tracer(HANDLERS[kind])
        sys.setprofile(tracer)
        try:
            await _send(kind, client)
        finally:
            sys.setprofile(None)
    return tracer.path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=MODEL)
    args = parser.parse_args()
    for kind in HANDLERS:
        path = asyncio.run(trace(kind, args.model))
        print(f"{kind}: {len(path.modules)} modules, {path.stays} stays, "
              f"{path.form_changes} changes of form")
        for module in path.modules:
            print(f"  {module}")
        for generation, names in sorted(path.forms.items()):
            print(f"  form {generation}: {', '.join(names)}")


if __name__ == "__main__":
    main()
