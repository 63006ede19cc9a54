"""Log-probabilities in the two shapes the OpenAI API uses (completions and chat)."""

from __future__ import annotations

import math
from typing import Any

from aioserve.outputs import TokenLogprob

#: What a non-finite log-probability is reported as (JSON has no -Infinity).
FLOOR = -9999.0


def _finite(value: float) -> float:
    return value if math.isfinite(value) else FLOOR


class TokenText:
    """Text of single tokens as they read inside a text (SentencePiece ``▁there`` is
    `` there``), cached; ``token_id:N`` without a tokenizer."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._cache: dict[int, str] = {}
        self._anchor: list[int] = []
        self._anchor_text = ""
        if tokenizer is not None:
            self._anchor = list(tokenizer("a", add_special_tokens=False).input_ids)
            self._anchor_text = tokenizer.decode(self._anchor)

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            if self._tokenizer is None:
                text = f"token_id:{token_id}"
            else:
                joined = self._tokenizer.decode(self._anchor + [token_id])
                if self._anchor and joined.startswith(self._anchor_text):
                    text = joined[len(self._anchor_text):]
                else:
                    text = self._tokenizer.decode([token_id])
            self._cache[token_id] = text
        return text


class CompletionLogprobs:
    """A /v1/completions choice's ``logprobs`` object, grown a delta at a time."""

    def __init__(self, token_text: TokenText, offset: int = 0) -> None:
        self._text = token_text
        self._offset = offset

    def delta(self, entries: list[TokenLogprob]) -> dict[str, Any]:
        """The object for new tokens (a stream chunk's, or one to :meth:`extend`)."""
        result: dict[str, Any] = {
            "tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []
        }
        for entry in entries:
            text = self._text(entry.token_id)
            result["tokens"].append(text)
            result["token_logprobs"].append(_finite(entry.logprob))
            result["top_logprobs"].append(
                {self._text(t): _finite(lp) for t, lp in entry.top} if entry.top else None
            )
            result["text_offset"].append(self._offset)
            self._offset += len(text)
        return result

    @staticmethod
    def extend(total: dict[str, Any] | None, part: dict[str, Any]) -> dict[str, Any]:
        """``total`` with ``part``'s lists appended (a new object when ``total`` is None)."""
        if total is None:
            return {key: list(values) for key, values in part.items()}
        for key, values in part.items():
            total[key].extend(values)
        return total


def chat_logprobs(token_text: TokenText, entries: list[TokenLogprob]) -> list[dict[str, Any]]:
    """The ``logprobs.content`` entries of a chat choice for new tokens."""

    def item(token_id: int, logprob: float) -> dict[str, Any]:
        text = token_text(token_id)
        return {"token": text, "logprob": _finite(logprob), "bytes": list(text.encode())}

    return [
        {**item(e.token_id, e.logprob), "top_logprobs": [item(t, lp) for t, lp in e.top]}
        for e in entries
    ]
