"""Decode attention on the CPU that reads the paged cache in place, through sparse kernels.

A decode group's attention is, per KV head, a sparse problem: query row (sequence b,
query head j) meets only the cache rows (slots) of sequence b. Two stock PyTorch CPU
kernels compute exactly that part without first copying each context out of the
paged cache:

* scores: ``torch.sparse.sampled_addmm`` (SDDMM) with a batched CSR pattern whose row
  (b, j) lists b's slots: ``mask + scale * q . K[slot]`` only at those entries, for
  every KV head in one call; the pattern's stored values are the group's additive
  mask, so padding slots come out ``-inf``;
* weighted values: ``F.embedding_bag(mode="sum", per_sample_weights=...)`` (an FBGEMM
  kernel): bag (KV head, b, j) sums its softmax weights times V's rows at b's slots.

Every (sequence, head) row is computed on its own, in a fixed order, so a request's
numbers do not depend on its batch-mates. Measured on the 2-core development box,
one layer of 32 sequences, 2 threads, against a block gather plus two batched
products (:mod:`~aioserve.runners.attention.decode_gather`): SmolLM2-135M's heads (9 query,
3 KV, dim 64) 2.45 -> 1.49 ms at 304 keys, 0.98 -> 0.62 ms at 160; the test model's
(8 / 4, dim 8, one thread) 0.93 -> 1.04 ms at 256, so heads narrower than
:data:`MIN_HEAD_DIM` keep the gather.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from aioserve.runners.attention.decode_gather import heads_by_sequence, queries_by_kv_head

__all__ = ["MIN_HEAD_DIM", "SparseDecodeIndex", "sparse_decode_attention"]

#: Narrowest head (k_dim, elements) that takes the sparse kernels.
MIN_HEAD_DIM = 32


@dataclass(frozen=True)
class SparseDecodeIndex:
    """One decode group's sparse pattern for layers of one head layout (built once a
    step, shared by those layers).

    Attributes:
        pattern: batched CSR ``[kv_heads, b * group, rows]`` (rows: the cache's slots),
            values the additive mask (0 or ``-inf``), ``b * group * L`` entries per head.
        bag_rows: ``[kv_heads * b * group * L]`` int64 rows of V's ``[kv_heads * rows,
            v_dim]`` view, bag by bag.
        bag_offsets: ``[kv_heads * b * group]`` int64, where each bag starts.
        length: L, keys per sequence (padding included).
    """

    pattern: torch.Tensor
    bag_rows: torch.Tensor
    bag_offsets: torch.Tensor
    length: int

    @classmethod
    def build(
        cls, gather_blocks: torch.Tensor, mask: torch.Tensor | None, block_size: int,
        kv_heads: int, group: int, rows: int,
    ) -> SparseDecodeIndex:
        """The pattern of ``b`` sequences reading ``gather_blocks`` (``[b, L /
        block_size]`` int64) with additive ``mask`` (``[b, 1, 1, L]`` or None), for
        ``kv_heads`` KV heads shared by ``group`` query heads each, in a cache of
        ``rows`` slots."""
        batch, num_blocks = (int(n) for n in gather_blocks.shape)
        length = num_blocks * block_size
        device = gather_blocks.device
        slots = (gather_blocks[:, :, None] * block_size
                 + torch.arange(block_size, device=device)).view(batch, 1, length)
        per_query = slots.expand(batch, group, length).reshape(-1)  # [b * group * L]
        entries = per_query.numel()
        cols = per_query.expand(kv_heads, entries).contiguous()
        crow = torch.arange(0, entries + 1, length, device=device).expand(kv_heads, -1)
        bias = (torch.zeros((batch, 1, 1, length), dtype=torch.float32, device=device)
                if mask is None else mask)
        values = bias.view(batch, 1, length).expand(batch, group, length).reshape(1, -1)
        with warnings.catch_warnings():  # "Sparse CSR tensor support is in beta state"
            warnings.simplefilter("ignore", UserWarning)
            pattern = torch.sparse_csr_tensor(
                crow.contiguous(), cols, values.expand(kv_heads, entries).contiguous(),
                size=(kv_heads, batch * group, rows), check_invariants=False,
            )
        head_offsets = torch.arange(0, kv_heads * rows, rows, device=device)
        bag_rows = (head_offsets[:, None] + per_query).view(-1)
        bag_offsets = torch.arange(0, bag_rows.numel(), length, device=device)
        return cls(pattern, bag_rows, bag_offsets, length)


def sparse_decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    index: SparseDecodeIndex, scaling: float | None,
) -> torch.Tensor:
    """Attention of one query per sequence over a head-major cache, in place.

    Args:
        q: ``[b, heads, k_dim]`` float32; heads a multiple of kv_heads (head h reads
            KV head ``h // (heads // kv_heads)``).
        k_cache, v_cache: ``[rows, kv_heads, dim]`` transposed views of head-major
            ``[kv_heads, rows, dim]`` storage (``allocate_kv_cache(head_major=True)``).
        index: the group's :class:`SparseDecodeIndex` for this head layout.
        scaling: score scale (default ``k_dim ** -0.5``).

    Returns:
        ``[b, heads, v_dim]``.
    """
    batch, heads, dim = (int(n) for n in q.shape)
    kv_heads, v_dim = int(k_cache.shape[1]), int(v_cache.shape[2])
    group = heads // kv_heads
    scale = scaling if scaling is not None else dim**-0.5
    queries = queries_by_kv_head(q, kv_heads).view(kv_heads, -1, dim)
    keys_t = k_cache.transpose(0, 1).transpose(1, 2)  # [kv_heads, dim, rows], a view
    scores = torch.sparse.sampled_addmm(index.pattern, queries, keys_t, alpha=scale)
    weights = torch.softmax(scores.values().view(-1, index.length), dim=-1)
    values = v_cache.transpose(0, 1).reshape(-1, v_dim)  # [kv_heads * rows, v_dim], a view
    out = F.embedding_bag(index.bag_rows, values, index.bag_offsets, mode="sum",
                          per_sample_weights=weights.view(-1))
    return heads_by_sequence(out.view(kv_heads, batch, group, v_dim))
