"""Incremental detokenization: no broken UTF-8, stop strings held back (BUG-16, BUG-18)."""

from __future__ import annotations

from aioserve.detokenizer import IncrementalDetokenizer

TEXT = "ok 🦙 世界!"


def stream(tokenizer, ids, prompt=(1,), stop=(), include=False):
    detok = IncrementalDetokenizer(tokenizer.backend_tokenizer, list(prompt), stop, include)
    deltas = []
    for token in ids:
        deltas.append(detok.add(token))
        if detok.stopped:
            break
    deltas.append(detok.finish() if not detok.stopped else "")
    return deltas, detok


def test_multibyte_characters_never_split(tokenizer):
    ids = tokenizer(TEXT).input_ids[1:]
    assert len(ids) > len(TEXT)  # byte-fallback tokens: characters span several tokens
    deltas, _ = stream(tokenizer, ids)
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == TEXT == tokenizer.decode(ids)


def test_cut_inside_a_character_ends_in_one_replacement_char(tokenizer):
    ids = tokenizer(TEXT).input_ids[1:]
    cut = next(i for i in range(1, len(ids)) if tokenizer.decode(ids[:i]).endswith("\ufffd"))
    deltas, _ = stream(tokenizer, ids[:cut])
    assert "\ufffd" not in "".join(deltas[:-1])
    assert "".join(deltas) == tokenizer.decode(ids[:cut])


def test_leading_space_follows_the_prompt(tokenizer):
    prompt = tokenizer("Once upon a").input_ids
    ids = tokenizer("Once upon a time").input_ids[len(prompt) :]
    deltas, _ = stream(tokenizer, ids, prompt)
    assert "".join(deltas) == " time"


def test_stop_string_spanning_tokens_never_leaks(tokenizer):
    ids = tokenizer("ABCDEFGHIJKLMNOP").input_ids[1:]
    deltas, detok = stream(tokenizer, ids, stop=("DEFGHIJ",))
    assert detok.stopped
    assert "".join(deltas) == "ABC"
    assert not any(set(d) & set("DEFGHIJ") for d in deltas)


def test_stop_string_kept_when_asked(tokenizer):
    ids = tokenizer("ABCDEFGHIJKLMNOP").input_ids[1:]
    deltas, _ = stream(tokenizer, ids, stop=("DEFGHIJ",), include=True)
    assert "".join(deltas) == "ABCDEFGHIJ"


def test_near_miss_is_released(tokenizer):
    ids = tokenizer("ABCDEFXYZ").input_ids[1:]
    deltas, detok = stream(tokenizer, ids, stop=("DEFGHIJ",))
    assert not detok.stopped
    assert "".join(deltas) == "ABCDEFXYZ"


#: Prompt and output ids on which the ``tokenizers`` streaming decoder raises "Invalid
#: prefix encountered while decoding stream" (found by a random search over this model's
#: vocabulary; a random-weight model emits such sequences).
PREFIX_ERROR_PROMPT, PREFIX_ERROR_OUTPUT = [1, 24], [167, 153, 296, 300, 47, 410, 2]


def test_stream_decoder_prefix_error_falls_back_to_full_decode(tokenizer):
    from tokenizers.decoders import DecodeStream

    backend = tokenizer.backend_tokenizer
    raw = DecodeStream(ids=PREFIX_ERROR_PROMPT, skip_special_tokens=True)
    try:
        for token in PREFIX_ERROR_OUTPUT:
            raw.step(backend, token)
        raise AssertionError("the streaming decoder no longer raises: pick other ids")
    except Exception as exc:
        assert "Invalid prefix" in str(exc)
    deltas, detok = stream(tokenizer, PREFIX_ERROR_OUTPUT, PREFIX_ERROR_PROMPT)
    assert detok.fallback
    # the prompt ends inside a character, so the text is the output's own decode
    assert "".join(deltas) == backend.decode(PREFIX_ERROR_OUTPUT, skip_special_tokens=True)
    assert "".join(deltas).endswith(" sa ha, ")
    assert "sa ha" in "".join(deltas[:-1])  # delivered while streaming, not only at the end
