"""An online output-length predictor: empirical length distributions per request class."""

from __future__ import annotations

import bisect
import json
import math
import os
from collections import deque
from pathlib import Path
from typing import Any

from aioserve.scheduling import RequestView
from schedulers.length_predictor import LengthPredictor

#: Format of a saved state (``state_path``).
STATE_VERSION = 1


class LengthDistribution:
    """The last ``window`` output lengths of one class, sorted, with tail sums cached."""

    def __init__(self, window: int) -> None:
        self.recent: deque[int] = deque()
        self.window = window
        self.sorted: list[int] = []
        self._tail: list[int] | None = None  # _tail[i] = sum(sorted[i:])

    def add(self, length: int) -> None:
        self.recent.append(length)
        bisect.insort(self.sorted, length)
        if len(self.recent) > self.window:
            del self.sorted[bisect.bisect_left(self.sorted, self.recent.popleft())]
        self._tail = None

    def beyond(self, n: int) -> tuple[int, int]:
        """(count, sum of L - n) over the lengths L > n."""
        if self._tail is None:
            tail = [0] * (len(self.sorted) + 1)
            for i in range(len(self.sorted) - 1, -1, -1):
                tail[i] = tail[i + 1] + self.sorted[i]
            self._tail = tail
        i = bisect.bisect_right(self.sorted, n)
        count = len(self.sorted) - i
        return count, self._tail[i] - n * count

    def quantile(self, q: float) -> int:
        """The ``q`` quantile (nearest rank) of the lengths; 0 when empty."""
        if not self.sorted:
            return 0
        return self.sorted[min(int(q * len(self.sorted)), len(self.sorted) - 1)]


class LearnedLengthPredictor(LengthPredictor):
    """Learns output lengths as the engine serves, with no second model.

    A request's classes, coarse to fine: all requests; its tenant; tenant and
    ``metadata[metadata_key]`` (a route or prompt template); those and the log2 bucket of
    its prompt length. Each class keeps the empirical distribution of the last ``window``
    lengths of requests that finished in it (quantiles: :meth:`quantiles`). The prediction
    of the output still to come after ``n`` tokens is E[L - n | L > n] (TRAIL's remaining
    length), estimated at each level from the class's lengths above ``n`` and shrunk
    toward the coarser level's estimate while the class is young:
    ``(m * own + k * parent) / (m + k)``, ``m`` the class's lengths above ``n``, ``k`` =
    ``prior_weight``. With nothing learnt: ``prior_length - n``, or ``n`` once past it.

    Args:
        metadata_key: the metadata key whose value names a request's route (default
            ``"route"``; absent: one route).
        prior_weight: ``k``, samples' worth of the coarser estimate (default 8, > 0).
        window: lengths kept per class (default 512, >= 1).
        prior_length: the output length assumed before anything finished (default 128).
        use_hints: a request's ``length_hint``, when given, is its length (default true).
        state_path: a JSON file: loaded when it exists, written every ``save_every``
            finished requests, by :meth:`save` and by :meth:`close` (the policy's close:
            engine shutdown, the end of a simulator run), so a restart need not relearn.
        save_every: finished requests between writes (default 64, >= 1).

    Raises:
        ValueError: a parameter out of range or of the wrong type (named), or an unreadable
            state file."""

    def __init__(self, metadata_key: str = "route", prior_weight: float = 8.0,
                 window: int = 512, prior_length: int = 128, use_hints: bool = True,
                 state_path: str | None = None, save_every: int = 64) -> None:
        _check("metadata_key", metadata_key, str)
        _check("use_hints", use_hints, bool)
        for name, value, low in (("window", window, 1), ("prior_length", prior_length, 1),
                                 ("save_every", save_every, 1)):
            _check(name, value, int)
            if value < low:
                raise ValueError(f"{name} must be >= {low}, got {value!r}")
        if isinstance(prior_weight, bool) or not isinstance(prior_weight, (int, float)) or not (
                0 < prior_weight < math.inf):
            raise ValueError(f"prior_weight must be a number > 0, got {prior_weight!r}")
        if state_path is not None:
            _check("state_path", state_path, str)
        self.metadata_key = metadata_key
        self.prior_weight = float(prior_weight)
        self.window = window
        self.prior_length = prior_length
        self.use_hints = use_hints
        self.state_path = state_path
        self.save_every = save_every
        self.classes: dict[str, LengthDistribution] = {}
        self.finished = 0
        self._keys: dict[str, tuple[str, ...]] = {}
        if state_path is not None and Path(state_path).exists():
            self.load(state_path)

    def class_keys(self, request: RequestView) -> tuple[str, ...]:
        """The request's classes, coarse to fine."""
        keys = self._keys.get(request.request_id)
        if keys is None:
            tenant = f"tenant={request.tenant or ''}"
            route = f"{tenant}|{self.metadata_key}={request.metadata.get(self.metadata_key, '')}"
            bucket = f"{route}|log2_prompt={request.num_prompt_tokens.bit_length()}"
            keys = self._keys[request.request_id] = ("*", tenant, route, bucket)
        return keys

    def remaining(self, request: RequestView) -> int:
        """Predicted output tokens still to come (>= 1 while it runs)."""
        n = request.num_output_tokens
        hint = request.params.length_hint
        if self.use_hints and hint is not None:
            return max(hint - n, 0)
        estimate = float(self.prior_length - n if n < self.prior_length else n)
        k = self.prior_weight
        for key in self.class_keys(request):
            dist = self.classes.get(key)
            if dist is None:
                break  # a finer class exists only where a coarser one does
            count, total = dist.beyond(n)
            if count:
                estimate = (total + k * estimate) / (count + k)
        return max(round(estimate), 1)

    def predict(self, request: RequestView) -> int:
        """Predicted output tokens in all."""
        return request.num_output_tokens + self.remaining(request)

    def quantiles(self, request: RequestView, qs: tuple[float, ...] = (0.5, 0.9)
                  ) -> tuple[int, ...]:
        """Quantiles of the finest of its classes holding ``prior_weight`` lengths or more."""
        best: LengthDistribution | None = None
        for key in self.class_keys(request):
            dist = self.classes.get(key)
            if dist is None or len(dist.sorted) < self.prior_weight:
                break
            best = dist
        return tuple(best.quantile(q) if best is not None else self.prior_length for q in qs)

    def on_finish(self, request: RequestView, output_len: int) -> None:
        """Learn a finished request's true output length."""
        for key in self.class_keys(request):
            dist = self.classes.get(key)
            if dist is None:
                dist = self.classes[key] = LengthDistribution(self.window)
            dist.add(output_len)
        self._keys.pop(request.request_id, None)
        self.finished += 1
        if self.state_path is not None and self.finished % self.save_every == 0:
            self.save(self.state_path)

    def close(self) -> None:
        """Save the state at ``state_path`` (if set) with every length learnt so far."""
        if self.state_path is not None:
            self.save(self.state_path)

    def forget(self, request: RequestView) -> None:
        """A request ended without a length worth learning (aborted or shed)."""
        self._keys.pop(request.request_id, None)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the state as JSON (atomically: a temporary file, then a rename)."""
        state = {"version": STATE_VERSION, "metadata_key": self.metadata_key,
                 "classes": {key: list(d.recent) for key, d in self.classes.items()}}
        target = Path(path)
        temporary = target.with_name(target.name + ".tmp")
        temporary.write_text(json.dumps(state))
        temporary.replace(target)
        return target

    def load(self, path: str | os.PathLike[str]) -> None:
        """Replace the state with a saved one; ValueError naming ``state_path`` if unreadable."""
        try:
            state = json.loads(Path(path).read_text())
            if state.get("version") != STATE_VERSION or not isinstance(state["classes"], dict):
                raise ValueError(f"not a version {STATE_VERSION} length-predictor state")
            classes: dict[str, LengthDistribution] = {}
            for key, lengths in state["classes"].items():
                dist = classes[str(key)] = LengthDistribution(self.window)
                for length in lengths:
                    if isinstance(length, bool) or not isinstance(length, int) or length < 0:
                        raise ValueError(f"class {key!r}: bad length {length!r}")
                    dist.add(length)
        except (OSError, ValueError, KeyError, AttributeError) as exc:
            raise ValueError(f"state_path {str(path)!r}: {exc}") from None
        self.classes = classes


def _check(name: str, value: Any, kind: type) -> None:
    if isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
        raise ValueError(f"{name} must be of type {kind.__name__}, got {value!r}")
