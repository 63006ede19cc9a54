"""``aioserve bench throughput``: against transformers static batching, or without caching."""

from __future__ import annotations

import dataclasses
import os
import statistics
from dataclasses import dataclass, field
from typing import Any

import torch

from aioserve.bench.throughput import ThroughputResult, run_aioserve
from aioserve.config import EngineConfig
from aioserve.workloads.request import WorkloadRequest
from aioserve.workloads.synthetic import prefix_repetition_requests, random_requests

#: ``compare`` choices: the baseline backend each one adds.
BASELINES = {"hf-static": "hf-static", "no-prefix-caching": "no-caching"}


@dataclass
class OfflineReport:
    """Every timed run of each backend, its warm-up apart, and mismatches with ``generate()``."""

    workload: dict[str, Any]
    threads: dict[str, int]
    runs: dict[str, list[ThroughputResult]] = field(default_factory=dict)
    warmups: dict[str, ThroughputResult] = field(default_factory=dict)
    mismatches: int | None = None

    def median(self, backend: str) -> ThroughputResult:
        results = sorted(self.runs[backend], key=lambda r: r.output_tokens_per_s)
        return results[(len(results) - 1) // 2]

    @property
    def baseline(self) -> str | None:
        return next((b for b in BASELINES.values() if b in self.runs), None)

    @property
    def ratio(self) -> float | None:
        """Median aioserve output rate over the baseline's median."""
        if self.baseline is None:
            return None
        ours = statistics.median(r.output_tokens_per_s for r in self.runs["aioserve"])
        theirs = statistics.median(r.output_tokens_per_s for r in self.runs[self.baseline])
        return ours / theirs

    def to_dict(self) -> dict[str, Any]:
        return {
            "workload": self.workload,
            "threads": self.threads,
            "runs": {k: [r.to_dict() for r in v] for k, v in self.runs.items()},
            "warmups": {k: r.to_dict() for k, r in self.warmups.items()},
            "median": {k: self.median(k).to_dict() for k in self.runs},
            "baseline": self.baseline,
            "ratio": self.ratio,
            "mismatches": self.mismatches,
        }


def model_vocab(model: str) -> tuple[int, int | None]:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model)
    text = config.get_text_config()
    return int(text.vocab_size), getattr(text, "bos_token_id", None)


def check_exact(model: Any, requests: list[WorkloadRequest], outputs: list[list[int]]) -> int:
    """How many outputs differ from a solo greedy ``generate()`` of the same request."""
    bad = 0
    device = next(model.parameters()).device
    for request, tokens in zip(requests, outputs):
        ids = torch.tensor([list(request.prompt_ids)], device=device)
        with torch.inference_mode():
            out = model.generate(
                ids, max_new_tokens=request.output_len, min_new_tokens=request.output_len,
                do_sample=False, eos_token_id=None, pad_token_id=0,
            )
        bad += out[0, ids.shape[1] :].tolist() != tokens
    return bad


def run_offline(
    config: EngineConfig,
    *,
    num_prompts: int,
    input_len: tuple[int, int],
    output_len: tuple[int, int],
    seed: int = 0,
    compare: str | None = None,
    prefix: tuple[int, int, int] | None = None,
    hf_batch_size: int = 32,
    runs: int = 1,
    threads: int | None = None,
    check: bool = False,
    progress: bool = False,
    tokenizer: bool = True,
) -> OfflineReport:
    """Run the workload ``runs`` times through aioserve and the ``compare`` baseline
    (``"hf-static"`` or ``"no-prefix-caching"``), alternating, after one untimed warm-up each.
    ``prefix``: (prefix length, suffix length, prefixes) for the prefix-repetition workload;
    ``threads``: each backend's compute threads (default: its own); ``tokenizer=False``: no
    detokenization.

    Raises:
        ValueError: bad sizes or an unknown ``compare``. OSError: the model cannot load."""
    if compare not in (None, *BASELINES):
        raise ValueError(f"compare must be one of {sorted(BASELINES)}, got {compare!r}")
    vocab, bos = model_vocab(config.model)
    bos = bos if bos is not None else 1
    if prefix is None:
        requests = random_requests(
            num_prompts, input_len, output_len, vocab_size=vocab, seed=seed, bos_token_id=bos
        )
    else:
        requests = prefix_repetition_requests(
            num_prompts, *prefix, output_len, vocab_size=vocab, seed=seed, bos_token_id=bos
        )
    workload = {
        "model": config.model, "num_prompts": num_prompts, "input_len": list(input_len),
        "output_len": list(output_len), "seed": seed, "max_num_seqs": config.max_num_seqs,
        "scheduler": config.scheduler, "hf_batch_size": hf_batch_size,
        "dataset": "random" if prefix is None else "prefix-repetition",
        "prefix_len_suffix_len_num_prefixes": list(prefix) if prefix else None,
        "enable_prefix_caching": config.enable_prefix_caching, "detokenize": tokenizer,
    }
    from aioserve.runners.torch.setup import cpu_threads, resolve_device

    saved = torch.get_num_threads()
    saved_env = os.environ.get("AIOSERVE_NUM_THREADS")
    if threads is not None:
        os.environ["AIOSERVE_NUM_THREADS"] = str(threads)
    device = resolve_device(config.device)
    hf_threads = threads or saved
    ours = cpu_threads(device) or saved
    report = OfflineReport(workload, {"hf-static": hf_threads, "aioserve": ours})
    hf_model = None
    if compare == "hf-static" or check:
        from transformers import AutoModelForCausalLM

        hf_model = AutoModelForCausalLM.from_pretrained(config.model).eval()
    outputs: list[list[int]] = []

    def run(backend: str) -> tuple[ThroughputResult, list[list[int]]]:
        if backend == "hf-static":
            from aioserve.bench.hf_static import run_hf_static

            torch.set_num_threads(hf_threads)
            try:
                return run_hf_static(hf_model, requests, batch_size=hf_batch_size,
                                     progress=progress)
            finally:
                torch.set_num_threads(saved)
        if backend == "no-caching":
            off = dataclasses.replace(config, enable_prefix_caching=False)
            return run_aioserve(off, requests, progress=progress, backend=backend,
                                tokenizer=tokenizer)
        return run_aioserve(config, requests, progress=progress, tokenizer=tokenizer)

    backends = {None: ["aioserve"], "hf-static": ["hf-static", "aioserve"],
                "no-prefix-caching": ["aioserve", "no-caching"]}[compare]
    try:
        for backend in backends:  # each side's warm-up pass, not counted
            report.warmups[backend], _ = run(backend)
        for _ in range(runs):
            for backend in backends:
                result, produced = run(backend)
                report.runs.setdefault(backend, []).append(result)
                if backend == "aioserve":
                    outputs = produced
        if check and hf_model is not None:
            torch.set_num_threads(hf_threads)
            report.mismatches = check_exact(hf_model, requests, outputs)
    finally:
        torch.set_num_threads(saved)
        if saved_env is None:
            os.environ.pop("AIOSERVE_NUM_THREADS", None)
        else:
            os.environ["AIOSERVE_NUM_THREADS"] = saved_env
    return report
