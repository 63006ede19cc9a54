"""How fast is the engine on a GPU against transformers' continuous batching? aioserve vs
transformers CB on a Qwen3-0.6B-shaped model.

Random bf16 weights, prompts U[64,512], outputs U[32,512], all at t=0; prints both tokens/s.
``--tiny`` runs a tiny config on a CPU in seconds (as the tests do).

    python3 benchmarks/serving/gpu_anchor.py                 # on an H200: the issue's anchor
    python3 benchmarks/serving/gpu_anchor.py --tiny --json   # anywhere"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from typing import Any

import torch
from transformers import AutoModelForCausalLM, Qwen3Config

from aioserve.config import EngineConfig
from aioserve.engine import AsyncEngine
from aioserve.runners.torch.runner import TorchRunner
from aioserve.sampling_params import SamplingParams
from aioserve.workloads.request import WorkloadRequest
from aioserve.workloads.synthetic import random_requests

FULL = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
            num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True)
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True)


def build_model(directory: str, tiny: bool, seed: int, dtype: torch.dtype) -> Qwen3Config:
    """Write a random-weight Qwen3 model (no tokenizer) to ``directory``."""
    config = Qwen3Config(**(TINY if tiny else FULL), max_position_embeddings=1024,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config, dtype=dtype).save_pretrained(directory)
    return config


async def _aioserve(config: EngineConfig, requests: list[WorkloadRequest]) -> tuple[float, int]:
    runner = await asyncio.to_thread(TorchRunner, config)
    async with AsyncEngine(config, runner=runner) as engine:

        async def one(request: WorkloadRequest) -> int:
            params = SamplingParams(max_tokens=request.output_len, temperature=0.0,
                                    ignore_eos=True)
            count = 0
            async for out in engine.generate(list(request.prompt_ids), params):
                count += len(out.token_ids)
            return count

        await asyncio.gather(*(one(r) for r in requests[:2]))  # warm-up
        start = time.perf_counter()
        counts = await asyncio.gather(*(one(r) for r in requests))
        return time.perf_counter() - start, sum(counts)


def run_aioserve(directory: str, requests: list[WorkloadRequest], slots: int, device: str,
                 max_model_len: int) -> dict[str, float]:
    """aioserve's wall time and output tokens/s (engine start not timed)."""
    config = EngineConfig(model=directory, max_num_seqs=slots, device=device,
                          max_model_len=max_model_len, max_num_batched_tokens=8192,
                          kv_cache_memory_bytes=64 * 1024**3)
    elapsed, tokens = asyncio.run(_aioserve(config, requests))
    return {"elapsed_s": elapsed, "output_tokens": tokens, "tokens_per_s": tokens / elapsed}


def run_transformers_cb(directory: str, requests: list[WorkloadRequest], device: str,
                        dtype: torch.dtype, cuda_graph: bool | None) -> dict[str, float]:
    """transformers continuous batching, its cache sized for the workload on the CPU."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype).to(device).eval()
    longest = max(r.output_len for r in requests)
    generation = GenerationConfig(do_sample=False, max_new_tokens=longest, eos_token_id=-1,
                                  pad_token_id=0)
    sizing: dict[str, int] = {}
    if device == "cpu":
        page = ContinuousBatchingConfig().page_size
        pages = sum(-(-(r.prompt_len + r.output_len) // page) for r in requests)
        sizing = {"num_blocks": pages + len(requests),  # aioserve's step budget:
                  "max_batch_tokens": 8192}
    cb_config = ContinuousBatchingConfig(use_cuda_graph=cuda_graph, **sizing)

    def serve(batch: list[WorkloadRequest]) -> int:
        manager = model.init_continuous_batching(generation_config=generation,
                                                 continuous_batching_config=cb_config)
        manager.start()
        for i, request in enumerate(batch):
            manager.add_request(list(request.prompt_ids), request_id=f"r{i}",
                                max_new_tokens=request.output_len, eos_token_id=-1)
        tokens = done = 0
        while done < len(batch):
            result = manager.get_result(timeout=1)
            if result is None:  # slow (a loaded machine) is fine; stopped is not
                if not manager.is_running():
                    raise RuntimeError("transformers continuous batching stopped early")
                continue
            if result.is_finished():
                done += 1
                tokens += len(result.generated_tokens)
        manager.stop(block=True)
        return tokens

    with torch.inference_mode():
        serve(requests[:2])  # warm-up
        start = time.perf_counter()
        tokens = serve(requests)
        elapsed = time.perf_counter() - start
    return {"elapsed_s": elapsed, "output_tokens": tokens, "tokens_per_s": tokens / elapsed}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="tiny config and workload (CPU)")
    parser.add_argument("--num-requests", type=int, default=None)
    parser.add_argument("--slots", type=int, default=256, help="aioserve max_num_seqs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--skip-transformers", action="store_true")
    parser.add_argument("--cuda-graph", action="store_true",
                        help="also run transformers with use_cuda_graph=True")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    num = args.num_requests or (12 if args.tiny else 256)
    input_len, output_len = ((4, 24), (4, 24)) if args.tiny else ((64, 512), (32, 512))
    figures: dict[str, Any] = {"tiny": args.tiny, "device": args.device, "num_requests": num,
                               "input_len": input_len, "output_len": output_len}
    with tempfile.TemporaryDirectory(prefix="aioserve-anchor-") as directory:
        config = build_model(directory, args.tiny, args.seed, dtype)
        requests = random_requests(num, input_len, output_len, vocab_size=config.vocab_size,
                                   seed=args.seed)
        max_len = input_len[1] + output_len[1]
        figures["aioserve"] = run_aioserve(directory, requests, args.slots, args.device, max_len)
        if not args.skip_transformers:
            figures["transformers_cb"] = run_transformers_cb(
                directory, requests, args.device, dtype, None)
            if args.cuda_graph:
                figures["transformers_cb_cuda_graph"] = run_transformers_cb(
                    directory, requests, args.device, dtype, True)
    if args.json:
        print(json.dumps(figures))
    else:
        for name in ("aioserve", "transformers_cb", "transformers_cb_cuda_graph"):
            if name in figures:
                f = figures[name]
                print(f"{name:>27}: {f['output_tokens']} tokens in {f['elapsed_s']:.2f} s = "
                      f"{f['tokens_per_s']:.0f} tokens/s")
    return figures


if __name__ == "__main__":
    main()
    sys.exit(0)
