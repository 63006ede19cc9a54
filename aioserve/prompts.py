"""Prompts as the engine takes them: text (encoded by the tokenizer) or token ids."""

from __future__ import annotations

from typing import Any


def _check_ids(ids: list[Any], vocab_size: int | None) -> None:
    for token in ids:
        if not isinstance(token, int) or isinstance(token, bool) or token < 0:
            raise ValueError(f"prompt token ids must be non-negative integers, got {token!r}")
        if vocab_size is not None and token >= vocab_size:
            raise ValueError(f"prompt token id {token} is outside the vocabulary ({vocab_size})")


def encode_prompt(prompt: str | list[int], tokenizer: Any, vocab_size: int | None) -> list[int]:
    """Token ids of text (with a tokenizer) or ids (each below ``vocab_size``, if given);
    ValueError, starting ``prompt``, for anything else or an empty prompt."""
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError("prompt is empty")
        if tokenizer is None:
            raise ValueError("prompt must be token ids: this engine has no tokenizer")
        ids = list(tokenizer(prompt).input_ids)
    elif isinstance(prompt, (list, tuple)):
        ids = list(prompt)
        _check_ids(ids, vocab_size)
    else:
        raise ValueError(
            f"prompt must be a string or a list of token ids, got {type(prompt).__name__}"
        )
    if not ids:
        raise ValueError("prompt is empty")
    return ids
