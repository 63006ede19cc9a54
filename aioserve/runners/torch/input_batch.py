"""The runner's persistent per-request state (vLLM V1's ``InputBatch``) and each step's inputs."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from aioserve.runners.base import NewRequest, ScheduledBatch


@dataclass
class RequestState:
    """One request's slot, tokens known at arrival and block-table entries in use."""

    slot: int
    token_ids: list[int]
    num_blocks: int


@dataclass(frozen=True)
class StepInputs:
    """One step's inputs, T tokens, B sequences, S sampled: ``input_ids`` ``[T]`` and
    ``logits_index``/``sample_slots`` ``[S]`` on the device; ``start_positions``,
    ``num_new_tokens``, ``slots`` ``[B]``, ``block_table`` ``[B, W]`` and ``sample_rows`` ``[S]``
    int64 numpy."""

    input_ids: torch.Tensor
    start_positions: np.ndarray
    num_new_tokens: np.ndarray
    block_table: np.ndarray
    slots: np.ndarray
    sample_rows: np.ndarray
    logits_index: torch.Tensor
    sample_slots: torch.Tensor


class InputBatch:
    """Slots, token ids, host block tables and each slot's last sampled token."""

    def __init__(
        self, max_num_seqs: int, max_model_len: int, block_size: int, device: torch.device
    ) -> None:
        self.device = device
        self.block_size = block_size
        max_blocks_per_seq = -(-max_model_len // block_size)
        self.requests: dict[str, RequestState] = {}
        self._free_slots = list(range(max_num_seqs - 1, -1, -1))
        self.host_block_table = np.zeros((max_num_seqs, max_blocks_per_seq), dtype=np.int64)
        self.last_sampled = torch.zeros(max_num_seqs, dtype=torch.int64, device=device)

    def apply(self, batch: ScheduledBatch) -> tuple[list[int], list[tuple[int, NewRequest]]]:
        """Release, add, extend block tables; the released slots and added (slot, request) pairs."""
        released = []
        for request_id in batch.released_ids:
            state = self.requests.pop(request_id, None)
            if state is not None:
                self._free_slots.append(state.slot)
                released.append(state.slot)
        added = [(self._add(new), new) for new in batch.new_requests]
        for request_id, blocks in batch.new_block_ids.items():
            self._extend(self.requests[request_id], blocks)
        return released, added

    def _add(self, new: NewRequest) -> int:
        if not self._free_slots:
            raise RuntimeError(f"no free slot for {new.request_id!r}")
        slot = self._free_slots.pop()
        self.requests[new.request_id] = RequestState(slot, new.token_ids, 0)
        self.host_block_table[slot] = 0
        self._extend(self.requests[new.request_id], new.block_ids)
        return slot

    def _extend(self, state: RequestState, blocks: list[int]) -> None:
        start, end = state.num_blocks, state.num_blocks + len(blocks)
        if end > self.host_block_table.shape[1]:
            raise RuntimeError(f"block table of {end} blocks exceeds the context length")
        self.host_block_table[state.slot, start:end] = blocks
        state.num_blocks = end

    def inputs(self, batch: ScheduledBatch) -> StepInputs:
        """The step's inputs, decoding tokens from :attr:`last_sampled`."""
        requests = self.requests
        states = [requests[request_id] for request_id in batch.request_ids]
        slots = np.fromiter((s.slot for s in states), dtype=np.int64, count=len(states))
        starts = np.asarray(batch.start_positions, dtype=np.int64)
        counts = np.asarray(batch.num_scheduled_tokens, dtype=np.int64)
        flat: list[int] = []
        pending_at: list[int] = []  # packed indices fed from last_sampled
        pending_slots: list[int] = []
        for state, start, count in zip(states, batch.start_positions,
                                       batch.num_scheduled_tokens):
            known = state.token_ids
            if start < len(known):
                flat += known[start : start + count]
            else:  # the one token sampled by the request's previous step
                pending_at.append(len(flat))
                pending_slots.append(state.slot)
                flat.append(0)
        if len(pending_at) == len(flat):  # a decode-only step: every input was sampled
            ids = self.last_sampled.index_select(0, torch.from_numpy(slots).to(self.device))
        else:
            ids = torch.tensor(flat, dtype=torch.int64).to(self.device, non_blocking=True)
            if pending_at:
                at = torch.tensor(pending_at, dtype=torch.int64).to(self.device,
                                                                    non_blocking=True)
                rows = torch.tensor(pending_slots, dtype=torch.int64).to(self.device,
                                                                         non_blocking=True)
                ids[at] = self.last_sampled[rows]
        sample_rows = np.flatnonzero(np.asarray(batch.sample, dtype=bool))
        ends = np.cumsum(counts) - 1
        width = max(1, -(-int((starts + counts).max()) // self.block_size))
        return StepInputs(
            ids, starts, counts, self.host_block_table[slots, :width], slots, sample_rows,
            torch.from_numpy(ends[sample_rows]).to(self.device),
            torch.from_numpy(slots[sample_rows]).to(self.device),
        )
