"""Which model architectures does the engine serve exactly? Each of the 30 tiny random
decoders, greedy, token for token against ``generate()``: exact / refused / WRONG (the table
of docs/MODEL_FAMILIES.md).

    python3 -m benchmarks.kernels.arch_coverage [model_type ...]
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import traceback
from pathlib import Path

import transformers

from aioserve.bench.models import coverage, tiny_models

TOKENIZER = str(Path(__file__).resolve().parents[3] / "shared" / "models" / "stories260K-hf")


def main(names: list[str]) -> int:
    transformers.logging.set_verbosity_error()
    logging.getLogger("aioserve").setLevel(logging.ERROR)
    prompt_ids = coverage.prompts()
    exact = 0
    names = names or list(tiny_models.ARCHITECTURES)
    for name in names:
        with tempfile.TemporaryDirectory() as tmp:
            try:
                verdict = coverage.check(name, Path(tmp), TOKENIZER, prompt_ids)
                status, detail = verdict.status, verdict.detail
            except Exception as exc:  # a crash is a finding, reported in the table
                traceback.print_exc(limit=-3)
                status, detail = "WRONG", f"crash: {type(exc).__name__}: {exc}"[:160]
        exact += status == "exact"
        print(f"| {name:<12} | {status:<7} | {detail} |", flush=True)
    print(f"{exact}/{len(names)} exact")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_type", nargs="*",
                        help=f"architectures (default: all {len(tiny_models.ARCHITECTURES)})")
    sys.exit(main(parser.parse_args().model_type))
