"""Tensor pieces of the batch sampler: greedy choice, the top-k / top-p mask, and
counter-based random numbers (a hash of seed, draw index and token id).

Every uniform is a pure function of its three coordinates, so a request's draws do not
depend on its batch-mates, its row, the device or how often it was preempted.

The hash is SplitMix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number
generators", OOPSLA 2014; the constants and shifts of Vigna's reference
https://prng.di.unimi.it/splitmix64.c), used at two levels:

* the key of draw ``d`` of seed ``s`` is ``mix(mix(s) + (d + 1) * GAMMA)``: output
  ``d + 1`` of a SplitMix64 stream started at ``mix(s)``;
* the 64-bit word of token ``v`` in that draw is ``mix(key + (v + 1) * GAMMA)``:
  output ``v + 1`` of a SplitMix64 stream started at ``key``;

all modulo 2**64. ``mix`` is the SplitMix64 finaliser (a variant of MurmurHash3's
fmix64). The arithmetic is done on int64 tensors: additions and products wrap modulo
2**64 (two's complement), and each right shift is masked after the fact because ``>>``
is arithmetic on int64. The uniform takes the word's 23 high bits ``m`` and is
``(2 m + 1) / 2**24``: exact in float32 and never 0 or 1.
"""

from __future__ import annotations

import torch

from aioserve.runners.cpu import native_kernels

_U64 = 1 << 64


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """``[R]`` int64, each row's arg max of ``logits`` ``[R, V]``, with ``torch.argmax``'s
    ties (first index) and NaN (counted largest); float32 on the CPU through the compiled
    kernel (:func:`~aioserve.runners.cpu.native_kernels.greedy_tokens`, 4x faster on
    ``[32, 49152]``) when it is loaded.

    Raises:
        RuntimeError: ``logits`` is not ``[R, V]`` with V >= 1 (the kernel or ``argmax``).
    """
    if logits.device.type == "cpu" and logits.dtype == torch.float32 \
            and native_kernels.available():
        return native_kernels.greedy_tokens(logits)
    return logits.argmax(dim=-1)


def _signed(value: int) -> int:
    """The int64 with the same 64 bits as ``value`` (taken modulo 2**64)."""
    value %= _U64
    return value - _U64 if value >= 1 << 63 else value


#: SplitMix64's increment (the golden ratio times 2**64), as int64.
GAMMA = _signed(0x9E3779B97F4A7C15)
_MUL1 = _signed(0xBF58476D1CE4E5B9)
_MUL2 = _signed(0x94D049BB133111EB)


def to_int64(seed: int) -> int:
    """A seed in ``[-2**63, 2**64)`` as the int64 with the same low 64 bits."""
    return _signed(seed)


def _shift_xor_(z: torch.Tensor, shift: int, scratch: torch.Tensor) -> None:
    """``z ^= z >>> shift`` in place (logical shift), using ``scratch`` (same shape)."""
    torch.bitwise_right_shift(z, shift, out=scratch)
    scratch.bitwise_and_((1 << (64 - shift)) - 1)
    z.bitwise_xor_(scratch)


def mix_(z: torch.Tensor) -> torch.Tensor:
    """The SplitMix64 finaliser, in place on an int64 tensor (any shape); returns ``z``."""
    scratch = torch.empty_like(z)
    _shift_xor_(z, 30, scratch)
    z.mul_(_MUL1)
    _shift_xor_(z, 27, scratch)
    z.mul_(_MUL2)
    _shift_xor_(z, 31, scratch)
    return z


def draw_keys(seeds: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
    """Key of each row's draw.

    Args:
        seeds: ``[R]`` int64, the rows' seeds.
        draws: ``[R]`` int64, the rows' draw indices (output index of the token).

    Returns:
        ``[R]`` int64 keys, ``mix(mix(seed) + (draw + 1) * GAMMA)``.
    """
    return mix_(mix_(seeds.clone()).add_((draws + 1) * GAMMA))


def token_offsets(token_ids: torch.Tensor) -> torch.Tensor:
    """``(token_ids + 1) * GAMMA`` (int64, same shape): a token's place in a key's stream."""
    return (token_ids + 1).mul_(GAMMA)


def uniforms(keys: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Uniforms ``(2 m + 1) / 2**24``, ``m`` the 23 high bits of each (row, token) word.

    Args:
        keys: ``[R]`` int64 from :func:`draw_keys`.
        offsets: ``[V]`` or ``[R, V]`` int64 from :func:`token_offsets`.

    Returns:
        ``[R, V]`` float32 in ``[2**-24, 1 - 2**-24]``.
    """
    z = keys.unsqueeze(-1) + offsets
    scratch = torch.empty_like(z)
    _shift_xor_(z, 30, scratch)
    z.mul_(_MUL1)
    _shift_xor_(z, 27, scratch)
    z.mul_(_MUL2)
    # mix's last step, z ^= z >>> 31, changes bits 0..32 only: skipped (bits 40..63 read)
    z.bitwise_right_shift_(40).bitwise_and_((1 << 24) - 1).bitwise_or_(1)  # 2 m + 1
    return z.to(torch.float32).mul_(2.0**-24)


def exponentials(keys: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Exp(1) variates ``q = -log(u)`` of :func:`uniforms` (same arguments): ``[R, V]``
    float32, all finite and > 0 (from about 6e-8 to about 16.6)."""
    return uniforms(keys, offsets).log_().neg_()


def filtered_out(
    scaled: torch.Tensor, top_k: torch.Tensor, max_k: int, top_p: torch.Tensor | None
) -> torch.Tensor:
    """Tokens outside each row's top-k or top-p nucleus, as ``filter_top_k_top_p`` of
    the former per-row sampler (``benchmarks/per_row_sampler.py``) defines them: below
    the k-th largest value (ties
    with it kept), or after the nucleus of the probabilities left by top-k (the
    smallest prefix in descending order whose mass reaches ``top_p``; ties in index
    order; the most likely token always kept).

    Args:
        scaled: ``[R, V]`` float32 logits divided by the temperature.
        top_k: ``[R, 1]`` int64, each row's k (V when off).
        max_k: the largest k below V (0 when no row has top-k).
        top_p: ``[R, 1]`` float32, each row's top-p (1 when off); None when all are 1.

    Returns:
        ``[R, V]`` bool. A row's mask depends only on the row: ``topk``'s values (not
        its ids) do not depend on how it orders ties, and the sort is stable.
    """
    vocab = scaled.shape[-1]
    kth = torch.full_like(scaled[:, :1], float("-inf"))
    if max_k:
        values = scaled.topk(max_k, dim=-1).values
        kth = torch.where(top_k < vocab, values.gather(1, top_k.clamp(max=max_k) - 1), kth)
    drop = scaled < kth
    if top_p is None:
        return drop
    ordered, order = scaled.masked_fill(drop, float("-inf")).sort(
        dim=-1, descending=True, stable=True
    )
    probs = (ordered - ordered[:, :1]).exp_()  # the softmax (torch.softmax is slow on
    probs /= probs.sum(dim=-1, keepdim=True)  # small rows on CPU)
    outside = (probs.cumsum(dim=-1) - probs >= top_p) & (top_p < 1.0)
    outside[:, 0] = False
    return drop | torch.empty_like(outside).scatter_(1, order, outside)


def splitmix64_reference(seed: int, count: int) -> list[int]:
    """The first ``count`` outputs of SplitMix64 seeded with ``seed``, in plain Python
    (unsigned 64-bit): the reference the tensor version is tested against."""
    out = []
    state = seed % _U64
    for _ in range(count):
        state = (state + 0x9E3779B97F4A7C15) % _U64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % _U64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % _U64
        out.append(z ^ (z >> 31))
    return out
