"""``aioserve bench throughput --random-model``: a random-weight model of a given shape,
built once into a cache directory and benchmarked without a tokenizer."""

from __future__ import annotations

import json

import pytest

from aioserve.bench.models.random_model import ensure_random_model, read_shape, shape_names
from aioserve.cli import main
from aioserve.workloads.synthetic import random_requests

TINY = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32,
    "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 600,
    "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "tie_word_embeddings": True,
    "bos_token_id": 1, "eos_token_id": 2,
}


@pytest.fixture
def tiny_config(tmp_path, monkeypatch):
    """A 2-layer llama config file; the model cache goes under ``tmp_path``."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path = tmp_path / "tiny-llama.json"
    path.write_text(json.dumps(TINY))
    return path


def test_bench_throughput_on_a_random_model(tiny_config, tmp_path, capsys):
    status = main([
        "bench", "throughput", "--random-model", str(tiny_config), "--num-prompts", "4",
        "--output-len", "4:8", "--max-num-seqs", "4", "--runs", "1", "--json",
    ])
    assert status == 0
    report = json.loads(capsys.readouterr().out)
    workload = report["workload"]
    assert workload["random_model"] == str(tiny_config) and workload["detokenize"] is False
    expected = random_requests(4, (8, 128), (4, 8), vocab_size=600, seed=0, bos_token_id=1)
    ours = report["median"]["aioserve"]
    assert ours["num_requests"] == 4 and len(report["runs"]["aioserve"]) == 1
    assert ours["output_tokens"] == sum(r.output_len for r in expected)
    assert ours["prompt_tokens"] == sum(r.prompt_len for r in expected)
    assert ours["output_tokens_per_s"] > 0 and report["ratio"] is None

    directory = tmp_path / "cache" / "aioserve" / "random-models"
    (model,) = directory.iterdir()  # built once, nothing left behind
    assert workload["model"] == str(model) and model.name.startswith("tiny-llama-")
    files = {p.name for p in model.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors"} <= files
    assert not any(name.startswith("tokenizer") for name in files)
    saved = json.loads((model / "config.json").read_text())
    assert (saved["hidden_size"], saved["num_hidden_layers"], saved["vocab_size"]) == (32, 2, 600)
    assert saved["dtype"] == "float32"
    assert json.loads((model / "generation_config.json").read_text())["eos_token_id"] == 2


def test_the_cached_model_is_reused_and_the_weights_are_seeded(tiny_config, tmp_path):
    first = ensure_random_model(str(tiny_config))
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert ensure_random_model(str(tiny_config)) == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp  # not rebuilt
    other = ensure_random_model(str(tiny_config), cache_dir=tmp_path / "elsewhere")
    assert other.name == first.name  # same config and seed, same key

    def weights(directory):
        return (directory / "model.safetensors").read_bytes()

    assert weights(other) == weights(first)
    reseeded = ensure_random_model(str(tiny_config), seed=1, cache_dir=tmp_path / "elsewhere")
    assert reseeded != other and weights(reseeded) != weights(other)


@pytest.mark.parametrize(("name", "sizes"), [
    ("smollm2-135m", ("llama", 576, 1536, 30, 9, 3, 64, 49152, 8192, 1e5, 1e-5, 1, 2)),
    ("qwen3-0.6b", ("qwen3", 1024, 3072, 28, 16, 8, 128, 151936, 40960, 1e6, 1e-6,
                    151643, 151645)),
])
def test_shipped_shapes(name, sizes):
    from transformers import AutoConfig

    assert name in shape_names()
    shape, settings = read_shape(name)
    config = AutoConfig.for_model(settings.pop("model_type"), **settings)
    got = (
        config.model_type, config.hidden_size, config.intermediate_size,
        config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads,
        config.head_dim, config.vocab_size, config.max_position_embeddings,
        config.rope_parameters["rope_theta"], config.rms_norm_eps, config.bos_token_id,
        config.eos_token_id,
    )
    assert shape == name and got == sizes and config.tie_word_embeddings is True


def test_unknown_shape_is_an_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    status = main(["bench", "throughput", "--random-model", "no-such-shape", "--json"])
    assert status == 2
    err = capsys.readouterr().err
    assert "no-such-shape" in err and "smollm2-135m" in err
    assert not (tmp_path / "aioserve").exists()


def test_model_and_random_model_exclude_each_other(tiny_config, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["bench", "throughput", "--model", "x", "--random-model", str(tiny_config)])
    assert exc.value.code == 2 and "not allowed with" in capsys.readouterr().err
