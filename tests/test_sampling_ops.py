"""The sampler's counter-based draws (sampling_ops): the splitmix64 hash, uniforms from
its high bits, exponentials, the same bits on CUDA (moved from test_batch_sampler.py)."""

from __future__ import annotations

import pytest
import torch

from aioserve.runners.torch import sampling_ops as ops


def splitmix64_reference(seed: int, count: int) -> list[int]:
    """SplitMix64's first ``count`` outputs in plain Python: the reference."""
    out = []
    state = seed % 2**64
    for _ in range(count):
        state = (state + 0x9E3779B97F4A7C15) % 2**64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2**64
        out.append(z ^ (z >> 31))
    return out


def test_hash_is_splitmix64():
    """Published test vectors of splitmix64 seeded with 1234567 (and other states)."""
    assert splitmix64_reference(1234567, 3) == [
        6457827717110365317, 3203168211198807973, 9817491932198370423,
    ]
    for state in [0, 1234567, 2**63 + 5, 2**64 - 1, -42]:
        key = torch.tensor([ops.to_int64(state)])
        offsets = ops.token_offsets(torch.arange(50))
        words = ops.mix_(key.unsqueeze(-1) + offsets)[0].tolist()
        assert [w % 2**64 for w in words] == splitmix64_reference(state, 50)
    seed, draw = 77, 5
    premixed = splitmix64_reference(seed - 0x9E3779B97F4A7C15, 1)[0]
    expected_key = splitmix64_reference(premixed, draw + 1)[-1]
    key = ops.draw_keys(torch.tensor([seed]), torch.tensor([draw]))
    assert int(key) % 2**64 == expected_key


def test_uniforms_are_the_high_bits_of_the_reference_words():
    seeds, draws = [5, -9, 2**62 + 3], [0, 7, 123_456]
    keys = ops.draw_keys(torch.tensor(seeds), torch.tensor(draws))
    got = ops.uniforms(keys, ops.token_offsets(torch.arange(300)))
    for row, key in enumerate(keys.tolist()):
        words = splitmix64_reference(key, 300)
        assert got[row].tolist() == [(2 * (w >> 41) + 1) / 2**24 for w in words]


def test_exponentials_are_positive_finite_with_unit_mean():
    keys = ops.draw_keys(torch.arange(4), torch.zeros(4, dtype=torch.int64))
    q = ops.exponentials(keys, ops.token_offsets(torch.arange(100_000)))
    assert q.dtype == torch.float32 and q.shape == (4, 100_000)
    assert bool(torch.isfinite(q).all()) and float(q.min()) > 0
    assert abs(float(q.mean()) - 1) < 0.01  # 400,000 draws: sd of the mean is 0.0016
    assert abs(float((q > 1).float().mean()) - 0.36788) < 0.005


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_hash_is_the_same_on_cuda():
    offsets = ops.token_offsets(torch.arange(4096))
    keys = ops.draw_keys(torch.arange(-3, 5), torch.arange(8) * 1000)
    cpu = ops.mix_(keys.unsqueeze(-1) + offsets)
    cuda = ops.mix_(keys.cuda().unsqueeze(-1) + offsets.cuda())
    assert torch.equal(cpu, cuda.cpu())
    q = ops.exponentials(keys.cuda(), offsets.cuda()).cpu()
    assert torch.allclose(q, ops.exponentials(keys, offsets), rtol=1e-6)
