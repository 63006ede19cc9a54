"""StepFeedback: what one engine step did, handed to the policy's ``on_step`` (and to
any other step observer, e.g. the simulator's calibration)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StepFeedback:
    """One finished step. The row tuples are aligned: one entry per request the step
    ran, in batch order.

    Attributes:
        step: the step's index (0 for the engine's first step).
        start_time: when the step started on the runner, seconds on the engine's clock
            (its submission, or the end of the step before it when that was later).
        end_time: when its tokens came back (same clock).
        request_ids: the requests it ran.
        num_computed_tokens: tokens each fed through the model (a prefill chunk, a
            recompute, or 1 when decoding).
        start_positions: each one's first position this step (its context before it).
        num_emitted_tokens: output tokens each received (0 or 1; 0 for a prefill chunk
            that does not reach the end, and for a request that ended or was preempted
            while the step ran).
        is_decode: whether each row was decoding (one token fed after an output token;
            a prompt, a chunk or a recompute is not).
        finished: ids of the requests that ended with this step (stop, length).
    """

    step: int
    start_time: float
    end_time: float
    request_ids: tuple[str, ...]
    num_computed_tokens: tuple[int, ...]
    start_positions: tuple[int, ...]
    num_emitted_tokens: tuple[int, ...]
    is_decode: tuple[bool, ...]
    finished: tuple[str, ...]

    @property
    def duration_s(self) -> float:
        """Seconds from start to end."""
        return self.end_time - self.start_time

    @property
    def num_tokens(self) -> int:
        """Tokens fed through the model (prefill + decode)."""
        return sum(self.num_computed_tokens)

    @property
    def num_seqs(self) -> int:
        """Rows (requests) the step ran."""
        return len(self.request_ids)

    @property
    def num_decode_seqs(self) -> int:
        """Rows that were decoding."""
        return sum(self.is_decode)

    @property
    def num_prefill_tokens(self) -> int:
        """Tokens fed by rows that were not decoding (prompts, chunks, recomputes)."""
        return self.num_tokens - self.num_decode_seqs

    @property
    def num_context_tokens(self) -> int:
        """KV-cache positions the step's attention read: each row's context up to its
        last new token, summed."""
        return sum(s + n for s, n in zip(self.start_positions, self.num_computed_tokens))

    def emitted(self) -> dict[str, int]:
        """Request id -> output tokens it received this step (rows with none omitted)."""
        return {r: n for r, n in zip(self.request_ids, self.num_emitted_tokens) if n}

    def served(self, prompt_weight: float = 1.0, output_weight: float = 2.0) -> dict[str, float]:
        """Request id -> service received this step, counted as VTC counts it (Sheng et
        al., "Fairness in Serving Large Language Models", OSDI 2024): weighted input
        tokens computed plus weighted output tokens emitted (a decode row's input token
        counts as its output). Default weights 1 and 2 follow the paper's experiments
        (OpenAI's price ratio)."""
        service: dict[str, float] = {}
        rows = zip(self.request_ids, self.num_computed_tokens, self.num_emitted_tokens,
                   self.is_decode)
        for r, n, e, decoding in rows:
            fed = 0 if decoding else n
            service[r] = service.get(r, 0.0) + prompt_weight * fed + output_weight * e
        return service
