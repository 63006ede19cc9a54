"""Random-weight models of a real shape (``--random-model``), built once and cached."""

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
    return sorted(path.stem for path in SHAPES_DIR.glob("*.json"))


def read_shape(spec: str) -> tuple[str, dict[str, Any]]:
    """``(name, config dict)`` of ``spec``: a config JSON file, a model directory, or a shipped
    shape's name.

    Raises:
        ValueError: neither, or the file holds no JSON object with a ``model_type``."""
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
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    return Path(base).expanduser() / "aioserve" / "random-models"


def model_key(config: dict[str, Any], seed: int) -> str:
    """12 hex digits identifying the model of ``config`` and ``seed``."""
    text = json.dumps({"config": config, "seed": seed, "format": _FORMAT}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def build(config: dict[str, Any], directory: Path, seed: int = 0) -> None:
    """Write the random-weight causal LM of ``config`` to ``directory``: drawn in float32, saved
    in the config's ``torch_dtype`` (as the real checkpoint ships; float32 when unstated)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    settings = dict(config)
    dtype = getattr(torch, str(settings.pop("torch_dtype", None) or "float32"))
    hf_config = AutoConfig.for_model(settings.pop("model_type"), **settings)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32).eval().to(dtype)
    text = hf_config.get_text_config()
    model.generation_config = GenerationConfig(
        bos_token_id=getattr(text, "bos_token_id", None),
        eos_token_id=getattr(text, "eos_token_id", None),
        pad_token_id=getattr(text, "pad_token_id", None),
    )
    model.save_pretrained(directory, safe_serialization=True)


def ensure_random_model(spec: str, *, seed: int = 0, cache_dir: Path | None = None) -> Path:
    """The directory of the random model of ``spec``, built on first use into
    ``<cache_dir>/<name>-<key>`` (a hidden sibling renamed into place, so one that exists is
    complete).

    Raises:
        ValueError: ``spec`` names no config, or transformers cannot build it.
        OSError: the cache directory cannot be written."""
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
