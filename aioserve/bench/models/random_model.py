"""Random-weight models of a real shape, for benchmarks: ``--random-model CONFIG``.

Speed depends on a model's shape, not on its weights, so a benchmark can run a real
architecture (e.g. SmolLM2-135M) without downloading it. The model is built from a
transformers ``config.json`` (a path, or the name of a shape shipped in
``aioserve/bench/models/model_shapes/``) with random weights from a fixed seed, saved once with
``save_pretrained`` (float32 safetensors, plus its generation config, no tokenizer) to a
cache directory, and then loaded like any model directory, so peer engines (vLLM) can
load the very same directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

#: Shapes shipped with the package: ``<name>.json`` transformers configs.
SHAPES_DIR = Path(__file__).parent / "model_shapes"

#: Bumped when the way models are built changes, so old cache entries are not reused.
_FORMAT = 1


def shape_names() -> list[str]:
    """Names of the shipped shapes (``smollm2-135m``, ``qwen3-0.6b``, …)."""
    return sorted(path.stem for path in SHAPES_DIR.glob("*.json"))


def read_shape(spec: str) -> tuple[str, dict[str, Any]]:
    """``(name, config dict)`` of ``spec``: a path to a config JSON file (or a model
    directory holding ``config.json``), else the name of a shipped shape.

    The name is the file's stem (its directory's name for a ``config.json``).

    Raises:
        ValueError: ``spec`` is neither an existing file nor a shipped shape, or the
            file holds no JSON object with a ``model_type``.
    """
    path = Path(spec).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        name = path.parent.name if path.stem == "config" else path.stem
    elif (SHAPES_DIR / f"{spec}.json").is_file():
        name, path = spec, SHAPES_DIR / f"{spec}.json"
    else:
        raise ValueError(f"--random-model {spec!r}: no such config file and no shipped shape "
                         f"(shipped: {', '.join(shape_names())})")
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"--random-model {spec!r}: cannot read {path}: {exc}") from None
    if not isinstance(config, dict) or "model_type" not in config:
        raise ValueError(f"--random-model {spec!r}: {path} is not a transformers config "
                         "(a JSON object with a model_type)")
    return name or "model", config


def cache_root() -> Path:
    """``$XDG_CACHE_HOME/aioserve/random-models`` (default ``~/.cache/...``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    return Path(base).expanduser() / "aioserve" / "random-models"


def model_key(config: dict[str, Any], seed: int) -> str:
    """12 hex digits identifying the model built from ``config`` with ``seed``
    (canonical JSON of both, and the build format)."""
    text = json.dumps({"config": config, "seed": seed, "format": _FORMAT}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def build(config: dict[str, Any], directory: Path, seed: int = 0) -> None:
    """Build the causal LM of ``config`` with random weights (``torch.manual_seed(seed)``,
    transformers' own initialisation, float32) and write it to ``directory`` with
    ``save_pretrained`` (safetensors), with a generation config carrying the config's
    BOS/EOS/pad ids.

    Raises:
        ValueError: transformers does not know the ``model_type``.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    settings = dict(config)
    hf_config = AutoConfig.for_model(settings.pop("model_type"), **settings)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32).eval()
    text = hf_config.get_text_config()
    model.generation_config = GenerationConfig(
        bos_token_id=getattr(text, "bos_token_id", None),
        eos_token_id=getattr(text, "eos_token_id", None),
        pad_token_id=getattr(text, "pad_token_id", None),
    )
    model.save_pretrained(directory, safe_serialization=True)


def ensure_random_model(spec: str, *, seed: int = 0, cache_dir: Path | None = None) -> Path:
    """The directory of the random model of ``spec`` (see :func:`read_shape`), built on
    first use into ``<cache_dir>/<name>-<key>`` (default :func:`cache_root`) and reused
    afterwards. The build goes to a hidden sibling that is renamed into place, so a
    directory that exists is complete.

    Raises:
        ValueError: ``spec`` names no config, or transformers cannot build it.
        OSError: the cache directory cannot be written.
    """
    name, config = read_shape(spec)
    root = cache_dir if cache_dir is not None else cache_root()
    final = root / f"{name}-{model_key(config, seed)}"
    if (final / "config.json").is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    scratch = root / f".{final.name}.{os.getpid()}.tmp"
    shutil.rmtree(scratch, ignore_errors=True)  # left by a killed build of this pid
    scratch.mkdir()
    try:
        build(config, scratch, seed)
        for file in scratch.iterdir():  # readable by peers, as the directory is
            file.chmod(0o644)
        (scratch / "random_model.json").write_text(
            json.dumps({"shape": name, "seed": seed, "source": spec}, indent=2) + "\n"
        )
        try:
            scratch.rename(final)
        except OSError:  # another process finished first: keep its copy
            if not (final / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return final
