"""Options shared by the commands that load a model."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import logging
import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aioserve.commands.memory_size import parse_memory
from aioserve.config import EngineConfig
from aioserve.model_path import check_model_path
from aioserve.runners.attention import registry as attention_registry
from aioserve.runners.cpu.native_dtypes import check_dtype
from aioserve.scheduling.registry import load_scheduler, params_by_policy

if TYPE_CHECKING:
    #: What ``ArgumentParser.add_subparsers`` returns; each command's ``add_parser`` takes it.
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]


def _number(kind: type[float], words: str, fits: Callable[[float], bool]
            ) -> Callable[[str], Any]:
    """An argparse type: ``kind`` of ``value`` where ``fits`` it, else an error in ``words``."""
    def parse(value: str) -> Any:
        try:
            number = kind(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {words}, got {value!r}") from None
        if not fits(number):  # NaN too
            raise argparse.ArgumentTypeError(f"must be {words}, got {value}")
        return number
    return parse


#: Argparse types: an integer >= 1, a number >= 0, a number > 0 (``inf`` allowed).
positive_int: Callable[[str], int] = _number(int, "a positive integer", lambda n: n > 0)
non_negative_float: Callable[[str], float] = _number(float, "a number >= 0", lambda n: n >= 0)
positive_float: Callable[[str], float] = _number(float, "a number > 0", lambda n: n > 0)


def positive_floats(value: str) -> list[float]:
    """An argparse type: a comma list of finite numbers > 0 (``0.9,1.2``)."""
    numbers = [positive_float(item) for item in value.split(",")]
    if math.inf in numbers:
        raise argparse.ArgumentTypeError(f"must be a comma list of finite numbers, got {value}")
    return numbers


def check_output(path: str | None, flag: str) -> None:
    """ValueError naming ``flag`` when the file ``path`` cannot be written: a directory, its
    folder missing, or either not writable (checked before any work; nothing is created)."""
    if path is None:
        return
    target = Path(path)
    if target.is_dir():
        raise ValueError(f"{flag}: {path!r} is a directory; give a file name")
    folder = target.parent
    if not folder.is_dir():
        raise ValueError(f"{flag}: no directory {str(folder)!r} to write {target.name!r} in")
    if not os.access(target if target.exists() else folder, os.W_OK):
        raise ValueError(f"{flag}: cannot write {path!r} (permission denied)")


def token_range(text: str) -> tuple[int, int]:
    """An argparse type: ``LO:HI`` or ``N`` token counts (argparse then names the flag)."""
    from aioserve.workloads.synthetic import parse_range

    try:
        return parse_range(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def check_device(device: str) -> None:
    """ValueError naming ``--device`` when it asks for CUDA and the installed torch is a CPU
    build (read from its version, without importing torch: under a second)."""
    if not device.startswith("cuda"):
        return
    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return  # the runner says torch is missing
    if version.endswith("+cpu"):
        raise ValueError(f"--device {device}: this torch ({version}) is a CPU build, without "
                         "CUDA; use --device cpu or auto")


def add_engine_options(parser: argparse.ArgumentParser) -> None:
    """Add --model, --scheduler, --max-num-seqs and the cache options."""
    parser.add_argument("--model", required=True, help="model directory or hub id")
    parser.add_argument("--tokenizer", default=None, help="tokenizer (default: the model's)")
    parser.add_argument("--scheduler", default="fcfs",
                        help="policy name (fcfs, static, spf, memory_aware, priority, vtc, edf, "
                             "mlfq, or an entry point) or package.module:Class")
    parser.add_argument("--scheduler-config", default=None, metavar="JSON",
                        help="the policy's parameters as a JSON object, e.g. "
                             "'{\"max_wait_s\": 5}' (see docs/schedulers.md)")
    parser.add_argument("--max-num-seqs", type=positive_int, default=32,
                        help="slots: most requests running at once")
    parser.add_argument("--max-num-batched-tokens", type=positive_int, default=4096,
                        help="most tokens (prefill + decode) in one step; longer prompts are "
                             "prefilled in chunks")
    parser.add_argument("--block-size", type=positive_int, default=16, help="tokens per KV block")
    parser.add_argument("--num-kv-blocks", type=positive_int, default=None,
                        help="KV cache size in blocks (overrides --kv-cache-memory)")
    parser.add_argument("--kv-cache-memory", default="4GiB", metavar="SIZE",
                        help="KV cache budget: a size (2GiB, 512MiB) or a fraction of free "
                        "memory (0.9 or 90%%; GPU: free device memory). Default 4GiB; never "
                        "more blocks than max-num-seqs x max-model-len need")
    parser.add_argument("--max-model-len", type=positive_int, default=None,
                        help="context length in tokens, at most the model's "
                             "(default: the model's max_position_embeddings)")
    parser.add_argument(
        "--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
        help="weights and KV cache dtype (auto: on the CPU the checkpoint's dtype where the "
             "CPU runs it natively, else float32; bfloat16 on CUDA)",
    )
    parser.add_argument("--device", default="auto",
                        help="auto (CUDA when present), cpu or cuda[:N]")
    parser.add_argument("--seed", type=int, default=0, help="seed for requests without one")
    add_prefix_caching_option(parser)
    add_runner_options(parser)


def scheduler_params(text: str | None) -> dict[str, Any] | None:
    """The ``--scheduler-config`` JSON object, or None; ValueError naming the option otherwise."""
    return json_object(text, "--scheduler-config", "'{\"max_wait_s\": 5}'")


def json_object(text: str | None, flag: str, example: str) -> dict[str, Any] | None:
    """A flag's JSON object, or None when not given; ValueError naming ``flag`` otherwise."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        if text.lstrip().startswith(("/", "./", "../", "~")) or text.endswith(".json"):
            raise ValueError(f"{flag}: takes the JSON text itself, not a file path ({text!r}); "
                             f"e.g. {flag} \"$(cat {text})\" or {flag} {example}") from None
        raise ValueError(f"{flag}: not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{flag}: must be a JSON object, e.g. {example}")
    return value


def flag_error(exc: ValueError, args: argparse.Namespace) -> ValueError:
    """``exc`` of a config refusing a field, led by the option that set the field."""
    message = str(exc).removeprefix("EngineConfig.")
    name = message.split(" ", 1)[0]
    if name in vars(args):
        return ValueError(f"--{name.replace('_', '-')}: {message}")
    return ValueError(message)


def check_scheduler(name: str, params: dict[str, Any] | None) -> None:
    """Make the policy once, so a bad name or parameter is refused before torch loads (and a
    file it would write, in a folder that is missing)."""
    try:
        load_scheduler(name, params)
    except ValueError as exc:
        raise ValueError(f"--scheduler/--scheduler-config: {exc}") from None
    check_policy_paths(params, "--scheduler-config")


def check_policy_paths(params: Mapping[str, Any] | None, flag: str) -> None:
    """Files a policy's parameters will write (a predictor's ``state_path``): refused when
    their folder is missing or not writable, before anything is learnt and lost."""
    if not params:
        return
    predictor = params.get("predictor_config")
    if isinstance(predictor, Mapping) and isinstance(predictor.get("state_path"), str):
        check_output(predictor["state_path"], f"{flag}: predictor_config.state_path")


def check_model(spec: str) -> None:
    """ValueError naming ``--model`` when its directory is missing or has no ``config.json``."""
    try:
        check_model_path(spec)
    except OSError as exc:
        raise ValueError(f"--model: {exc}") from None


def add_runner_options(parser: argparse.ArgumentParser) -> None:
    """Add ``--forward`` and ``--attention-backend`` (how the runner runs the model)."""
    add_forward_option(parser)
    parser.add_argument(
        "--attention-backend", default="reference",
        choices=list(attention_registry.backend_names()),
        help="attention implementation behind the runner's seam: reference (exact, any "
             "device) or flex (FlexAttention over the paged cache; compiled, with CUDA "
             "graphs for decode steps, on CUDA)",
    )
    parser.add_argument("--enforce-eager", action="store_true",
                        help="never capture CUDA graphs (vLLM's flag of the same name)")
    parser.add_argument(
        "--batch-invariant", action=argparse.BooleanOptionalAction, default=True,
        help="a request's greedy tokens in any batch equal its tokens alone (row padding "
             "and a 32-key context floor on the CPU); --no-batch-invariant saves that time",
    )


def add_forward_option(parser: argparse.ArgumentParser) -> None:
    """Add ``--forward``, defaulting to :class:`EngineConfig`'s."""
    parser.add_argument(
        "--forward", default=EngineConfig.forward,
        choices=["auto", *attention_registry.FORWARDS],
        help="the model's forward: auto (the default: the lean forward where it applies and "
             "its logits equal transformers' bit for bit at load, else transformers'), the "
             "model's own (any decoder), or the lean forward of Llama checkpoints (fewer "
             "Python calls; on the CPU; checked bit for bit against transformers' at load)",
    )


def add_prefix_caching_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
        help="reuse the KV blocks of prompt prefixes already computed (default: on)",
    )


def engine_config(args: argparse.Namespace) -> EngineConfig:
    """EngineConfig from parsed options, checked without loading torch (policy made once, model
    directory looked at).

    Raises:
        ValueError: an option is refused; the message names it."""
    try:
        budget = parse_memory(args.kv_cache_memory)
    except ValueError as exc:
        raise ValueError(f"--kv-cache-memory: {exc}") from None
    given = scheduler_params(args.scheduler_config)  # its refusals name the flag
    try:  # one object of parameters, or keyed by the policy's spec or name
        params = params_by_policy([args.scheduler], given)
    except ValueError as exc:  # an unknown policy
        raise ValueError(f"--scheduler/--scheduler-config: {exc}") from None
    check_scheduler(args.scheduler, params[args.scheduler])
    check_model(args.model)
    check_device(args.device)
    check_dtype(args.dtype, args.device)
    try:
        return EngineConfig(
            model=args.model,
            tokenizer=args.tokenizer,
            scheduler=args.scheduler,
            scheduler_config=params[args.scheduler],
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            block_size=args.block_size,
            num_kv_blocks=args.num_kv_blocks,
            kv_cache_memory_bytes=budget.bytes or EngineConfig.kv_cache_memory_bytes,
            kv_cache_memory_fraction=budget.fraction,
            max_model_len=args.max_model_len,
            dtype=args.dtype,
            device=args.device,
            seed=args.seed,
            enable_prefix_caching=args.enable_prefix_caching,
            forward=args.forward,
            attention_backend=args.attention_backend,
            enforce_eager=args.enforce_eager,
            batch_invariant=args.batch_invariant,
        )
    except ValueError as exc:
        raise flag_error(exc, args) from None


def quiet_loading(verbose: bool) -> None:
    """aiohttp's access-log line per request only when ``verbose``."""
    logging.getLogger("aiohttp.access").setLevel(logging.NOTSET if verbose else logging.WARNING)
