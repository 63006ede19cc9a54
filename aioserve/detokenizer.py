"""Incremental detokenization with stop strings on ``tokenizers.DecodeStream``: joined
deltas equal decode(prompt + output) - decode(prompt); a delta never holds a broken
UTF-8 character, nor text that could still become a stop string."""

from __future__ import annotations

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

_MAX_PARTS = 64


def _held_back(text: str, stops: tuple[str, ...]) -> int:
    longest = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:size]):
                longest = size
                break
    return longest


class IncrementalDetokenizer:
    """Turns one request's output tokens into text deltas (``tokenizer``: a
    ``tokenizers.Tokenizer``; the prompt primes the stream, keeping leading spaces)."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_token_ids: list[int],
        stop: tuple[str, ...] = (),
        include_stop_str_in_output: bool = False,
    ) -> None:
        self._tokenizer = tokenizer
        self._prompt = prompt_token_ids
        self._stream = DecodeStream(ids=prompt_token_ids, skip_special_tokens=True)
        self._stop = stop
        self._max_stop = max((len(s) for s in stop), default=0)
        self._include_stop = include_stop_str_in_output
        self._token_ids: list[int] = []
        # The text so far: _text, then pieces not yet joined (without stop strings a
        # piece is appended, and joined when read or every _MAX_PARTS pieces: growing a
        # string attribute by += copies it whole each token).
        self._text = ""
        self._parts: list[str] = []
        self._emitted = 0
        self.stopped = False
        self.fallback = False

    @property
    def text(self) -> str:
        if self._parts:
            self._text += "".join(self._parts)
            self._parts.clear()
        return self._text

    def add(self, token_id: int) -> str:
        """Decode one more token; returns the text safe to send now (``stopped`` once a
        stop string matched)."""
        self._token_ids.append(token_id)
        piece: str | None = None
        if not self.fallback:
            try:
                piece = self._stream.step(self._tokenizer, token_id)
            except Exception:
                self.fallback = True
        if self.fallback:
            piece = self._fallback_step()
        if not piece:
            return ""
        if not self._stop:  # nothing held back: the delta is the new piece
            parts = self._parts
            parts.append(piece)
            if len(parts) >= _MAX_PARTS:
                self._text += "".join(parts)
                parts.clear()
            self._emitted += len(piece)
            return piece
        self._text = text = self._text + piece  # (no pieces pending with stop strings)
        search_from = max(0, len(text) - len(piece) - self._max_stop + 1)
        for stop in self._stop:
            index = text.find(stop, search_from)
            if index >= 0:
                self.stopped = True
                self._text = text = text[: index + len(stop) if self._include_stop else index]
                return self._emit(text, len(text))
        return self._emit(text, len(text) - _held_back(text, self._stop))

    def _fallback_step(self) -> str | None:
        # After DecodeStream failed ("Invalid prefix encountered" on some byte-fallback
        # sequences): the difference of two full decodes, a trailing U+FFFD held back.
        text = self.text
        tail = self._decoded_tail().rstrip("\ufffd")
        if len(tail) <= len(text) or not tail.startswith(text):
            return None
        return tail[len(text) :]

    def _decoded_tail(self) -> str:
        # the output alone when a character's bytes are split between prompt and output
        decode = self._tokenizer.decode
        prompt_text = decode(self._prompt, skip_special_tokens=True)
        full = decode(self._prompt + self._token_ids, skip_special_tokens=True)
        if full.startswith(prompt_text):
            return full[len(prompt_text) :]
        return decode(self._token_ids, skip_special_tokens=True)

    def finish(self) -> str:
        """The text still held back, at the end of generation."""
        text = self.text
        if not self.stopped:
            tail = self._decoded_tail()
            if tail.startswith(text):
                self._text = text = tail
        return self._emit(text, len(text))

    def _emit(self, text: str, upto: int) -> str:
        if upto <= self._emitted:
            return ""
        delta = text[self._emitted : upto]
        self._emitted = upto
        return delta
