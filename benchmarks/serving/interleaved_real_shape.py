"""How fast is the engine against vLLM CPU on a real-shape model, on a shared machine? vLLM
CPU and aioserve on a real-shape random model, timed passes taken in turn.

Both engines load once and stay loaded; timed passes alternate (vLLM first in even rounds) so a
shared box's drift cancels. Workload and settings are ``peers_real_shape.py``'s; an idle engine
polls a file, taking no core.

python3 benchmarks/serving/interleaved_real_shape.py --rounds 4 --aioserve-forward lean-llama"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
POLL_S = 0.1


def peers_module() -> Any:
    """``peers_real_shape.py`` (workload, model directory, vLLM paths) by file."""
    spec = importlib.util.spec_from_file_location("peers_real_shape", HERE / "peers_real_shape.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def wait_for_turn(control: Path, name: str, turn: int) -> bool:
    """Block until the driver asks ``name`` for pass ``turn`` (True) or says stop."""
    go, stop = control / f"go-{name}-{turn}", control / "stop"
    while not go.exists():
        if stop.exists():
            return False
        time.sleep(POLL_S)
    return True


def vllm_worker(job: dict[str, Any], control: Path) -> None:
    """Runs in the vLLM venv: load, warm up, one timed generate per turn."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    llm = peers_module().vllm_llm(job)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, detokenize=False)
              for n in job["outs"]]
    prompts = [TokensPrompt(prompt_token_ids=p) for p in job["prompts"]]
    short = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, detokenize=False)
    llm.generate(prompts[:2], [short, short], use_tqdm=False)
    llm.reset_prefix_cache()
    (control / "ready-vllm").touch()
    turn = 0
    while wait_for_turn(control, "vllm", turn):
        start = time.perf_counter()
        res = llm.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - start
        llm.reset_prefix_cache()
        got = sum(len(r.outputs[0].token_ids) for r in res)
        (control / f"row-vllm-{turn}.json").write_text(json.dumps(
            {"engine": "vllm", "wall_s": round(wall, 3), "generated_tokens": got}))
        turn += 1


def aioserve_worker(job: dict[str, Any], control: Path, forward: str) -> None:
    """Runs in aioserve's Python: one engine, warmed up, one timed pass per turn."""
    from aioserve.bench.throughput import run_engine
    from aioserve.config import EngineConfig
    from aioserve.engine import AsyncEngine
    from aioserve.runners.torch.runner import TorchRunner
    from aioserve.workloads.synthetic import token_request

    config = EngineConfig(model=job["model"], max_num_seqs=job["max_num_seqs"], forward=forward,
                          enable_prefix_caching=job["prefix_caching"])
    requests = [token_request(i, p, n) for i, (p, n) in enumerate(zip(job["prompts"], job["outs"]))]

    async def serve() -> None:
        runner = await asyncio.to_thread(TorchRunner, config)
        try:
            async with AsyncEngine(config, runner=runner) as engine:
                short = [token_request(len(requests) + i, list(r.prompt_ids), 4)
                         for i, r in enumerate(requests[:2])]
                await run_engine(engine, short)
                engine.reset_prefix_cache()
                (control / "ready-aioserve").touch()
                turn = 0
                while await asyncio.to_thread(wait_for_turn, control, "aioserve", turn):
                    result, _ = await run_engine(engine, requests)
                    engine.reset_prefix_cache()
                    (control / f"row-aioserve-{turn}.json").write_text(json.dumps(
                        {"engine": "aioserve", "forward": forward,
                         "wall_s": round(result.elapsed_s, 3),
                         "generated_tokens": result.output_tokens}))
                    turn += 1
        finally:
            runner.close()

    asyncio.run(serve())


def take_turn(control: Path, name: str, turn: int, procs: list[subprocess.Popen]) -> dict:
    """Ask ``name`` for pass ``turn`` and wait for its row (RuntimeError if a worker died)."""
    (control / f"go-{name}-{turn}").touch()
    row = control / f"row-{name}-{turn}.json"
    while not row.exists():
        if any(p.poll() is not None for p in procs):
            raise RuntimeError(f"a worker exited while {name} ran pass {turn}")
        time.sleep(POLL_S)
    time.sleep(POLL_S)  # the row file is written in one call; let it land
    return json.loads(row.read_text())


def start_workers(a: argparse.Namespace, peers: Any, job_path: Path, control: Path,
                  logs: list[Any]) -> list[subprocess.Popen]:
    """Both workers, warmed up; RuntimeError (naming the log) if one exits first."""
    this = str(Path(__file__).resolve())
    vllm_env = peers.vllm_env(a.vllm_bind, a.vllm_kv_gib) | {"VLLM_SLEEP_WHEN_IDLE": "1"}
    ours_env = dict(os.environ, PYTHONPATH=str(HERE.parents[1]))
    procs = []
    for name, cmd, env in (
        ("vllm", [a.vllm_python, this, "--_vllm", str(job_path), str(control)], vllm_env),
        ("aioserve", [sys.executable, this, "--_aioserve", str(job_path), str(control),
                      a.aioserve_forward], ours_env),
    ):
        log = open(peers.PEERS / f"interleaved-{name}.log", "w")  # noqa: SIM115 (closed by main)
        logs.append(log)
        procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))
        while not (control / f"ready-{name}").exists():  # one at a time: loads don't overlap
            if procs[-1].poll() is not None:
                raise RuntimeError(f"{name} worker failed to start; see {log.name}")
            time.sleep(POLL_S)
    return procs


def report(rows: list[dict[str, Any]], output_tokens: int) -> None:
    """Every pass, each round's ratio and the medians (output tokens / wall s)."""
    for row in rows:
        row["output_tok_s"] = round(output_tokens / row["wall_s"], 1)
        print(json.dumps(row), flush=True)
    rounds = sorted({row["round"] for row in rows})
    rate = {(r["round"], r["engine"]): r["output_tok_s"] for r in rows}
    ratios = [rate[(r, "aioserve")] / rate[(r, "vllm")] for r in rounds]
    medians = {e: statistics.median(r["output_tok_s"] for r in rows if r["engine"] == e)
               for e in ("vllm", "aioserve")}
    print(json.dumps({"summary": "aioserve / vllm, passes in turn",
                      "round_ratios": [round(x, 3) for x in ratios],
                      "median_round_ratio": round(statistics.median(ratios), 3),
                      "median_tok_s": medians}), flush=True)


def main() -> None:
    if len(sys.argv) >= 4 and sys.argv[1] in ("--_vllm", "--_aioserve"):
        job, control = json.loads(Path(sys.argv[2]).read_text()), Path(sys.argv[3])
        if sys.argv[1] == "--_vllm":
            return vllm_worker(job, control)
        return aioserve_worker(job, control, sys.argv[4])
    peers = peers_module()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--random-model", default="smollm2-135m", help="shape name or config.json")
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--input-len", type=peers.range_arg, default=(8, 128))
    ap.add_argument("--output-len", type=peers.range_arg, default=(16, 256))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-num-seqs", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=4, help="timed passes per engine")
    ap.add_argument("--vllm-python", default=str(peers.PEERS / "vllm-venv" / "bin" / "python"))
    ap.add_argument("--vllm-bind", default="0-1", help="VLLM_CPU_OMP_THREADS_BIND")
    ap.add_argument("--vllm-kv-gib", type=int, default=2)
    ap.add_argument("--aioserve-forward", default="lean-llama")
    a = ap.parse_args()
    if a.rounds < 1:
        ap.error(f"--rounds must be at least 1, got {a.rounds}")
    a.prefix_caching = True
    model = peers.model_dir(a.random_model)
    prompts, outs = peers.workload(model, a)
    print(json.dumps({"model": str(model), "requests": len(prompts), "output_tokens": sum(outs),
                      "prompt_tokens": sum(map(len, prompts)), "vllm_bind": a.vllm_bind,
                      "aioserve_forward": a.aioserve_forward}), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        control = Path(tmp)
        job_path = control / "job.json"
        job_path.write_text(json.dumps({
            "model": str(model), "prompts": prompts, "outs": outs, "max_num_seqs": a.max_num_seqs,
            "max_model_len": 512, "prefix_caching": a.prefix_caching}))
        logs: list[Any] = []
        procs: list[subprocess.Popen] = []
        rows = []
        try:
            procs = start_workers(a, peers, job_path, control, logs)
            for turn in range(a.rounds):
                order = ("vllm", "aioserve") if turn % 2 == 0 else ("aioserve", "vllm")
                for name in order:
                    rows.append(take_turn(control, name, turn, procs)
                                | {"round": turn, "load": os.getloadavg()[0]})
        finally:
            (control / "stop").touch()
            for proc in procs:
                try:
                    proc.wait(timeout=120)
                except subprocess.TimeoutExpired:
                    proc.kill()
            for log in logs:
                log.close()
    bad = [r for r in rows if r["generated_tokens"] != sum(outs)]
    if bad:
        raise SystemExit(f"token counts differ from the workload's: {bad}")
    report(rows, sum(outs))


if __name__ == "__main__":
    main()
