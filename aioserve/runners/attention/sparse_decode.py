"""CPU decode attention reading the paged cache in place through stock sparse kernels: scores by
``torch.sparse.sampled_addmm`` over a batched CSR pattern of each sequence's slots (its values
the additive mask), values by ``F.embedding_bag(mode="sum")``. Each (sequence, head) is computed
alone in a fixed order: batch-invariant. Heads narrower than :data:`MIN_HEAD_DIM` keep the
gather."""

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
    """One decode group's CSR pattern and embedding bags for one head layout."""

    pattern: torch.Tensor
    bag_rows: torch.Tensor
    bag_offsets: torch.Tensor
    length: int

    @classmethod
    def build(
        cls, gather_blocks: torch.Tensor, mask: torch.Tensor | None, block_size: int,
        kv_heads: int, group: int, rows: int,
    ) -> SparseDecodeIndex:
        """The pattern of ``b`` sequences reading ``gather_blocks`` under ``mask``."""
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
    """``[b, heads, k_dim]`` float32 queries over a head-major cache, in place."""
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
