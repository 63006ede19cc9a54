"""The baseline: transformers ``generate()`` with static batches and left padding."""

from __future__ import annotations

import time
from typing import Any

import torch

from aioserve.bench.throughput import ThroughputResult
from aioserve.workloads.request import WorkloadRequest
from aioserve.workloads.synthetic import token_request


def left_pad(prompts: list[list[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)``, both ``[B, max_len]`` int64, padded on the left."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.int64)
    mask = torch.zeros((len(prompts), width), dtype=torch.int64)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.int64)
        mask[row, width - len(prompt) :] = 1
    return ids, mask


def generate_static(
    model: Any, requests: list[WorkloadRequest], pad_token_id: int
) -> list[list[int]]:
    """One static batch, greedy, EOS ignored: each request's first ``output_len`` generated ids."""
    ids, mask = left_pad([list(r.prompt_ids) for r in requests], pad_token_id)
    longest = max(r.output_len for r in requests)
    device = next(model.parameters()).device
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            max_new_tokens=longest,
            min_new_tokens=longest,
            do_sample=False,
            pad_token_id=pad_token_id,
            eos_token_id=None,
        )
    new = out[:, ids.shape[1] :].tolist()
    return [row[: r.output_len] for row, r in zip(new, requests)]


def run_hf_static(
    model: Any,
    requests: list[WorkloadRequest],
    *,
    batch_size: int = 32,
    progress: bool = False,
) -> tuple[ThroughputResult, list[list[int]]]:
    """Time ``generate()`` over batches (padding with token 0), after an untimed warm-up;
    only requested tokens count (as vLLM's ``hf`` backend)."""
    from tqdm import tqdm

    generate_static(model, [token_request(i, list(r.prompt_ids), 4)
                            for i, r in enumerate(requests[:2])], 0)
    outputs: list[list[int]] = []
    bar = tqdm(total=len(requests), desc="hf-static", unit="req", disable=not progress)
    start = time.perf_counter()
    for first in range(0, len(requests), batch_size):
        chunk = requests[first : first + batch_size]
        outputs.extend(generate_static(model, chunk, 0))
        bar.update(len(chunk))
    elapsed = time.perf_counter() - start
    bar.close()
    return ThroughputResult.of("hf-static", requests, elapsed), outputs
