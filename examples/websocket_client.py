"""Talk to `aioserve serve` over its websocket: two interleaved requests on one socket.

    aioserve serve --model ../shared/models/stories260K-hf &
    python examples/websocket_client.py ws://127.0.0.1:8000/ws
"""

from __future__ import annotations

import asyncio
import sys

import aiohttp


async def main(url: str) -> None:
    texts = {"a": "", "b": ""}
    async with aiohttp.ClientSession() as http, http.ws_connect(url) as ws:
        await ws.send_json({"type": "generate", "id": "a", "prompt": "Once upon a time",
                            "max_tokens": 30, "temperature": 0})
        await ws.send_json({"type": "generate", "id": "b", "prompt": "The cat",
                            "max_tokens": 30, "temperature": 0})
        finished = 0
        while finished < len(texts):
            message = await ws.receive_json()
            if message["type"] == "token":
                texts[message["id"]] += message["text"]
            elif message["type"] == "done":
                finished += 1
                print(f"{message['id']}: {texts[message['id']]!r} ({message['finish_reason']})")
            else:
                print("error:", message)
                finished += 1


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "ws://127.0.0.1:8000/ws"))
