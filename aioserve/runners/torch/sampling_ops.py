"""Tensor pieces of the batch sampler: greedy choice, the top-k / top-p mask, and counter-based
uniforms that are a pure function of (seed, draw index, token id), so draws never depend on
batch-mates, row, device or preemption.

The hash is SplitMix64 (Steele, Lea and Flood, OOPSLA 2014; constants from
https://prng.di.unimi.it/splitmix64.c) on int64 tensors (wrapping arithmetic, right shifts
masked): the key of draw ``d`` is ``mix(mix(s) + (d + 1) * GAMMA)``, the word of token ``v``
``mix(key + (v + 1) * GAMMA)``, and the uniform ``(2 m + 1) / 2**24`` of its 23 high bits (exact
in float32, never 0 or 1)."""

from __future__ import annotations

import torch

from aioserve.runners.cpu import native_kernels

_U64 = 1 << 64


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """``[R]`` int64 arg max of ``logits`` ``[R, V]`` with ``torch.argmax``'s ties and NaN."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32 \
            and native_kernels.available():
        return native_kernels.greedy_tokens(logits)
    return logits.argmax(dim=-1)


def _signed(value: int) -> int:
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
    """``z ^= z >>> shift`` in place (logical shift)."""
    torch.bitwise_right_shift(z, shift, out=scratch)
    scratch.bitwise_and_((1 << (64 - shift)) - 1)
    z.bitwise_xor_(scratch)


def mix_(z: torch.Tensor) -> torch.Tensor:
    """The SplitMix64 finaliser, in place on an int64 tensor; returns ``z``."""
    scratch = torch.empty_like(z)
    _shift_xor_(z, 30, scratch)
    z.mul_(_MUL1)
    _shift_xor_(z, 27, scratch)
    z.mul_(_MUL2)
    _shift_xor_(z, 31, scratch)
    return z


def draw_keys(seeds: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
    """``[R]`` int64 keys of each row's draw from ``seeds`` and ``draws`` ``[R]`` int64."""
    return mix_(mix_(seeds.clone()).add_((draws + 1) * GAMMA))


def token_offsets(token_ids: torch.Tensor) -> torch.Tensor:
    """``(token_ids + 1) * GAMMA``: a token's place in a key's stream."""
    return (token_ids + 1).mul_(GAMMA)


def uniforms(keys: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """``[R, V]`` float32 uniforms in ``[2**-24, 1 - 2**-24]``."""
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
    """Exp(1) variates ``-log(u)`` of :func:`uniforms`: ``[R, V]`` float32, finite and > 0."""
    return uniforms(keys, offsets).log_().neg_()


def filtered_out(
    scaled: torch.Tensor, top_k: torch.Tensor, max_k: int, top_p: torch.Tensor | None
) -> torch.Tensor:
    """``[R, V]`` bool: tokens outside each row's top-k or top-p nucleus."""
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

