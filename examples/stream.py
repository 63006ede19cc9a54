"""Stream three requests at once from the test model and print them as they finish.

    python examples/stream.py ../shared/models/stories260K-hf
"""

from __future__ import annotations

import asyncio
import sys

from aioserve import AsyncEngine, EngineConfig, SamplingParams


async def complete(engine: AsyncEngine, prompt: str, params: SamplingParams) -> str:
    text = ""
    async for out in engine.generate(prompt, params):
        text += out.text
    return prompt + text


async def main(model: str) -> None:
    params = SamplingParams(max_tokens=48, temperature=0.8, top_p=0.95, seed=0)
    prompts = ["Once upon a time", "The little dog", "One day, Tom"]
    async with AsyncEngine(EngineConfig(model=model, max_num_seqs=8)) as engine:
        for story in await asyncio.gather(*(complete(engine, p, params) for p in prompts)):
            print(story, end="\n\n")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "../shared/models/stories260K-hf"))
