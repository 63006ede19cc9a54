"""Golden output: the engine and the CLI equal transformers generate() on the real model."""

from __future__ import annotations

import subprocess
import sys

from aioserve import AsyncEngine, EngineConfig, SamplingParams

GOLDEN = (
    ", there was a little girl named Lily. She loved to play outside in the park. "
    "One day, she saw a big, red ball."
)


async def test_generate_streams_the_golden_continuation(model_dir, tokenizer, solo_greedy):
    prompt_ids = tokenizer("Once upon a time").input_ids
    expected_ids = solo_greedy(prompt_ids, 40, ignore_eos=False)
    assert tokenizer.decode(expected_ids) == GOLDEN
    async with AsyncEngine(
        EngineConfig(model=model_dir, scheduler="fcfs", max_num_seqs=32)
    ) as engine:
        outputs = [
            out
            async for out in engine.generate(
                "Once upon a time", SamplingParams(max_tokens=40, temperature=0.0)
            )
        ]
    assert "".join(o.text for o in outputs) == GOLDEN
    assert [t for o in outputs for t in o.token_ids] == expected_ids
    assert outputs[-1].finished and outputs[-1].finish_reason == "length"
    assert not any(o.finished for o in outputs[:-1])
    assert outputs[-1].num_prompt_tokens == 5 and outputs[-1].num_output_tokens == 40


def test_cli_generate_prints_the_continuation(model_dir):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "aioserve.cli",
            "generate",
            "Once upon a time",
            "--model",
            model_dir,
            "--max-tokens",
            "40",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert result.stdout == GOLDEN + "\n"


async def test_natural_stop_on_the_models_end_of_story_token(model_dir, tokenizer, solo_greedy):
    # The test model ends a story with <s> (id 1), listed in its generation_config.
    prompt_ids = tokenizer("Once upon a time").input_ids
    expected = solo_greedy(prompt_ids, 400, ignore_eos=False)
    assert expected[-1] == 1 and len(expected) == 342
    async with AsyncEngine(EngineConfig(model=model_dir)) as engine:
        outputs = [
            o
            async for o in engine.generate(
                prompt_ids, SamplingParams(max_tokens=400, temperature=0)
            )
        ]
    assert [t for o in outputs for t in o.token_ids] == expected
    assert outputs[-1].finish_reason == "stop"
    assert outputs[-1].text == ""  # the stop token adds no text
    full_text = "".join(o.text for o in outputs)
    assert full_text == tokenizer.decode(expected, skip_special_tokens=True)


def test_cli_reports_a_missing_model_in_one_line(tmp_path):
    missing = str(tmp_path / "no-such-model")
    result = subprocess.run(
        [sys.executable, "-m", "aioserve.cli", "generate", "hi", "--model", missing],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("aioserve: error: --model: ")
    assert "does not exist" in result.stderr
