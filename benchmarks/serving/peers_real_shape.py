"""How fast is aioserve against vLLM's CPU build on a real-shape model, same workload, at
each dtype? (random weights; vLLM offline, aioserve through its Python API)

The workload is ``aioserve bench throughput``'s (``aioserve.workloads.synthetic``): all requests
at t=0, greedy, EOS ignored, exact output lengths; figure of merit output tokens / wall s. Each
engine runs in its own process (vLLM from ``--vllm-python``, ``VLLM_CPU_OMP_THREADS_BIND`` from
``--vllm-bind``, at each ``--vllm-dtype``; aioserve through its Python API from each
``--aioserve-repo``, at each ``--aioserve-dtype``), one short warm-up request before the timed
run; neither detokenizes. ``--rounds`` repeats the aioserve runs, alternating. One JSON line per
run; then aioserve's bfloat16-vs-float32 greedy agreement (share of identical sequences, first
divergence; reported, not asserted) and aioserve's median against vLLM's best.

    python3 benchmarks/serving/peers_real_shape.py               # smollm2-135m, bind auto
    python3 benchmarks/serving/peers_real_shape.py --vllm-bind auto,0-1 --random-model qwen3-0.6b
    python3 benchmarks/serving/peers_real_shape.py --aioserve-repo before=/tmp/base,after=. \
        --rounds 3"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
PEERS = Path(os.environ.get("PEERS_DIR", "/work/peers"))


def emit(row: dict[str, Any]) -> None:
    print(json.dumps(row), flush=True)


def load_workloads() -> Any:
    """This checkout's ``aioserve.workloads.synthetic`` (the driver runs from any folder)."""
    sys.path.insert(0, str(REPO))
    return importlib.import_module("aioserve.workloads.synthetic")


def workload(model: Path, a: argparse.Namespace) -> tuple[list[list[int]], list[int]]:
    """(prompts, output lengths) exactly as ``aioserve bench throughput`` draws them."""
    config = json.loads((model / "config.json").read_text())
    text = config.get("text_config") or config
    bos = text.get("bos_token_id", config.get("bos_token_id"))
    requests = load_workloads().random_requests(
        a.num_prompts, a.input_len, a.output_len, vocab_size=int(text["vocab_size"]),
        seed=a.seed, bos_token_id=bos if bos is not None else 1)
    return [list(r.prompt_ids) for r in requests], [r.output_len for r in requests]


def model_dir(spec: str) -> Path:
    """The random model's directory, built by aioserve (this Python) if not cached."""
    code = ("import sys; from aioserve.bench.models.random_model import ensure_random_model; "
            "print(ensure_random_model(sys.argv[1]))")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-c", code, spec], env=env, check=True,
                         capture_output=True, text=True)
    return Path(out.stdout.strip().splitlines()[-1])


def vllm_env(bind: str, kv_gib: int) -> dict[str, str]:
    """Environment of a vLLM process: OMP bind, KV cache GiB, offline, no usage stats."""
    env = dict(os.environ, VLLM_CPU_OMP_THREADS_BIND=bind,
               VLLM_CPU_KVCACHE_SPACE=str(kv_gib), HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
    env.pop("OMP_NUM_THREADS", None)  # vLLM sets it from the bind list
    env.pop("PYTHONPATH", None)
    return env


def vllm_llm(job: dict[str, Any]) -> Any:
    """vLLM's offline ``LLM`` for a job (its dtype, no tokenizer), in the vLLM venv."""
    from vllm import LLM

    return LLM(model=job["model"], dtype=job["dtype"], max_num_seqs=job["max_num_seqs"],
               max_model_len=job["max_model_len"], max_num_batched_tokens=4096,
               enable_prefix_caching=job["prefix_caching"], skip_tokenizer_init=True, seed=0)


def run_vllm(a: argparse.Namespace, model: Path, job: Path, bind: str,
             dtype: str) -> dict[str, Any]:
    """One vLLM process (``--_worker``) with OMP bind ``bind`` at ``dtype``; its JSON row."""
    env = vllm_env(bind, a.vllm_kv_gib)
    log_path = PEERS / f"vllm-real-shape-{bind}-{dtype}.log"
    result = job.with_name(f"vllm-{bind}-{dtype}.json")
    job = job.with_name(f"job-{dtype}.json")
    job.write_text(json.dumps(json.loads(job.with_name("job.json").read_text()) | {"dtype": dtype}))
    cmd = [a.vllm_python, str(Path(__file__).resolve()), "--_worker", str(job), str(result)]
    with open(log_path, "w") as log:  # vLLM logs to both streams
        try:
            proc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=a.vllm_timeout)
        except subprocess.TimeoutExpired:
            return {"engine": "vllm", "omp_bind": bind, "dtype": dtype, "error": "timeout",
                    "log": str(log_path)}
    text = log_path.read_text(errors="replace")
    if proc.returncode != 0 or not result.is_file():
        return {"engine": "vllm", "omp_bind": bind, "dtype": dtype,
                "error": f"worker rc={proc.returncode}",
                "log": str(log_path), "tail": text.strip().splitlines()[-5:]}
    cores = re.findall(r"core ids=\[([^\]]*)\]", text)
    omp = [c for c in (cores[-1].split(",") if cores else []) if c.strip()]
    return json.loads(result.read_text()) | {
        "omp_bind": bind, "dtype": dtype, "omp_threads": len(omp) or None,
        "omp_core_ids": cores[-1] if cores else None, "log": str(log_path)}


def vllm_worker(job_path: str, result_path: str) -> None:
    """Runs in the vLLM venv: load, warm up, time one generate; the row goes to ``result_path``."""
    job = json.loads(Path(job_path).read_text())
    prompts, outs = job["prompts"], job["outs"]
    import vllm
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    start = time.perf_counter()
    llm = vllm_llm(job)
    load_s = time.perf_counter() - start

    def params(n: int) -> SamplingParams:
        return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, detokenize=False)

    llm.generate([TokensPrompt(prompt_token_ids=prompts[0][:8])], [params(8)], use_tqdm=False)
    tps = [TokensPrompt(prompt_token_ids=p) for p in prompts]
    start = time.perf_counter()
    res = llm.generate(tps, [params(n) for n in outs], use_tqdm=False)
    wall = time.perf_counter() - start
    got = [len(r.outputs[0].token_ids) for r in res]
    Path(result_path).write_text(json.dumps({
        "engine": "vllm", "version": vllm.__version__, "wall_s": round(wall, 3),
        "output_tok_s": round(sum(outs) / wall, 1), "output_tokens": sum(outs),
        "generated_tokens": sum(got), "exact_token_counts": got == outs,
        "prompt_tokens": sum(map(len, prompts)), "load_s": round(load_s, 1),
        "prefix_caching": job["prefix_caching"], "max_model_len": job["max_model_len"],
    }))


def aioserve_worker(job_path: str, result_path: str) -> None:
    """Runs with the aioserve under test on PYTHONPATH: load, warm up, time one run of the job's
    requests; the row and each request's tokens go to ``result_path``."""
    job = json.loads(Path(job_path).read_text())
    from aioserve.bench.throughput import run_aioserve
    from aioserve.config import EngineConfig

    config = EngineConfig(model=job["model"], dtype=job["dtype"], forward=job["forward"],
                          max_num_seqs=job["max_num_seqs"],
                          enable_prefix_caching=job["prefix_caching"])
    try:  # the checkout under test: since the lab's rooms (issue 48), or before them
        from aioserve.workloads.synthetic import token_request
        requests = [token_request(i, p, n) for i, (p, n) in enumerate(zip(job["prompts"],
                                                                        job["outs"]))]
    except ImportError:
        from aioserve.bench.workloads import BenchRequest  # type: ignore[import-not-found]
        requests = [BenchRequest(p, n) for p, n in zip(job["prompts"], job["outs"])]
    result, tokens = run_aioserve(config, requests, tokenizer=False)
    Path(result_path).write_text(json.dumps({
        "engine": "aioserve", "wall_s": round(result.elapsed_s, 3),
        "output_tok_s": round(result.output_tokens_per_s, 1),
        "output_tokens": result.output_tokens, "tokens": tokens}))


def run_aioserve(a: argparse.Namespace, job: Path, label: str, repo: Path, dtype: str,
                 forward: str) -> dict[str, Any]:
    """One aioserve process (``--_aioserve-worker``) from ``repo`` at ``dtype``; its JSON row
    (the tokens under ``tokens``)."""
    work = job.with_name(f"aioserve-{label}-{dtype}.json")
    work.write_text(json.dumps(json.loads(job.read_text()) | {"dtype": dtype, "forward": forward}))
    result = work.with_name(f"result-{work.name}")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--_aioserve-worker", str(work),
           str(result)]
    out = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=str(repo)), capture_output=True,
                         text=True)
    row = {"engine": "aioserve", "label": label, "dtype": dtype, "forward": forward}
    if out.returncode != 0 or not result.is_file():
        return row | {"error": f"rc={out.returncode}", "tail": out.stderr.strip().splitlines()[-5:]}
    return row | json.loads(result.read_text())


def agreement(first: list[list[int]], second: list[list[int]]) -> dict[str, Any]:
    """Share of identical sequences and, over the others, the first differing position."""
    diverged = [next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
                for a, b in zip(first, second) if a != b]
    return {"identical": f"{len(first) - len(diverged)}/{len(first)}",
            "identical_share": round(1 - len(diverged) / len(first), 3),
            "first_divergence_min": min(diverged, default=None),
            "first_divergence_median": statistics.median(diverged) if diverged else None}


def range_arg(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition(":")
    return int(lo), int(hi or lo)


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--_worker":
        return vllm_worker(sys.argv[2], sys.argv[3])
    if len(sys.argv) == 4 and sys.argv[1] == "--_aioserve-worker":
        return aioserve_worker(sys.argv[2], sys.argv[3])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--random-model", default="smollm2-135m", help="shape name or config.json")
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--input-len", type=range_arg, default=(8, 128))
    ap.add_argument("--output-len", type=range_arg, default=(16, 256))
    ap.add_argument("--seed", type=int, default=0, help="workload seed (aioserve's default)")
    ap.add_argument("--max-num-seqs", type=int, default=32)
    ap.add_argument("--no-prefix-caching", dest="prefix_caching", action="store_false",
                    help="both engines without prefix caching (default: on, both defaults)")
    ap.add_argument("--vllm-python", default=str(PEERS / "vllm-venv" / "bin" / "python"))
    ap.add_argument("--vllm-bind", default="auto", help="VLLM_CPU_OMP_THREADS_BIND value(s)")
    ap.add_argument("--vllm-dtype", default="bfloat16,float32",
                    help="vLLM dtype(s), comma-separated; each is run, the best compared")
    ap.add_argument("--vllm-kv-gib", type=int, default=2, help="VLLM_CPU_KVCACHE_SPACE")
    ap.add_argument("--vllm-max-model-len", type=int, default=512)
    ap.add_argument("--vllm-timeout", type=int, default=3600, help="seconds per vLLM process")
    ap.add_argument("--no-aioserve", dest="aioserve", action="store_false")
    ap.add_argument("--aioserve-forward", default="auto", help="aioserve's forward")
    ap.add_argument("--aioserve-dtype", default="auto,float32",
                    help="aioserve dtype(s), comma-separated (auto: the checkpoint's where native)")
    ap.add_argument("--aioserve-repo", default=f"this={REPO}",
                    help="LABEL=PATH of aioserve checkouts, comma-separated (e.g. a baseline)")
    ap.add_argument("--rounds", type=int, default=1, help="aioserve rounds, alternating")
    a = ap.parse_args()
    model = model_dir(a.random_model)
    prompts, outs = workload(model, a)
    emit({"model": str(model), "requests": len(prompts), "output_tokens": sum(outs),
          "prompt_tokens": sum(map(len, prompts)), "load": os.getloadavg()})
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp) / "job.json"
        job.write_text(json.dumps({
            "model": str(model), "prompts": prompts, "outs": outs,
            "max_num_seqs": a.max_num_seqs, "max_model_len": a.vllm_max_model_len,
            "prefix_caching": a.prefix_caching}))
        for bind in [b.strip() for b in a.vllm_bind.split(",") if b.strip()]:
            for dtype in [d.strip() for d in a.vllm_dtype.split(",") if d.strip()]:
                if not Path(a.vllm_python).is_file():
                    rows.append({"engine": "vllm", "unavailable": f"{a.vllm_python} not found"})
                    break
                rows.append(run_vllm(a, model, job, bind, dtype) | {"load": os.getloadavg()})
                emit(rows[-1])
        repos = [item.split("=", 1) for item in a.aioserve_repo.split(",") if item.strip()]
        dtypes = [d.strip() for d in a.aioserve_dtype.split(",") if d.strip()]
        for _ in range(a.rounds if a.aioserve else 0):
            for label, repo in repos:
                for dtype in dtypes:
                    row = run_aioserve(a, job, label, Path(repo).resolve(), dtype,
                                       a.aioserve_forward) | {"load": os.getloadavg()}
                    rows.append(row)
                    emit({k: v for k, v in row.items() if k != "tokens"})
    summarise(rows, repos, dtypes)


def summarise(rows: list[dict[str, Any]], repos: list[list[str]], dtypes: list[str]) -> None:
    """Per aioserve checkout and dtype the median rate; bf16-vs-fp32 agreement; against vLLM."""
    vllm = [r for r in rows if r["engine"] == "vllm" and "output_tok_s" in r]
    best = max(vllm, key=lambda r: r["output_tok_s"], default=None)
    for label, _ in repos:
        medians, tokens = {}, {}
        for dtype in dtypes:
            runs = [r for r in rows if r["engine"] == "aioserve" and r.get("label") == label
                    and r["dtype"] == dtype and "output_tok_s" in r]
            if not runs:
                continue
            medians[dtype] = statistics.median(r["output_tok_s"] for r in runs)
            tokens[dtype] = runs[0]["tokens"]
            line = {"summary": f"aioserve {label} {dtype}", "median_output_tok_s":
                    medians[dtype], "runs": [r["output_tok_s"] for r in runs]}
            if best is not None:
                line |= {"vs_vllm_best": round(medians[dtype] / best["output_tok_s"], 3),
                         "vllm_best": f"{best['dtype']} bind {best['omp_bind']}: "
                                      f"{best['output_tok_s']}"}
            emit(line)
        names = list(tokens)
        for i, one in enumerate(names):
            for other in names[i + 1:]:
                emit({"agreement": f"aioserve {label} {one} vs {other}"}
                     | agreement(tokens[one], tokens[other]))


if __name__ == "__main__":
    main()
