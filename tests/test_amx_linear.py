"""bfloat16 products on AMX tiles (runners/cpu/amx_linear.py, csrc/amx_linear.cpp).

The kernel builds only where the compiler targets AMX-BF16; elsewhere these tests skip and
bfloat16 weights stay on oneDNN.
"""

from __future__ import annotations

import pytest
import torch

from aioserve.runners.cpu import amx_linear, packed_linear


@pytest.fixture
def amx():
    """Skips, at run time (the kernels build in a session fixture after collection), where the
    AMX product did not build or the OS lends no AMX tiles."""
    if not amx_linear.available():
        pytest.skip("the AMX product did not build here (no AMX-BF16)")


@pytest.mark.parametrize(("out_features", "in_features"), [(576, 576), (960, 576), (48, 64),
                                                           (576, 1536)])
def test_a_row_gets_the_same_bits_in_any_call_and_the_sums_are_right(amx, out_features,
                                                                     in_features):
    gen = torch.Generator().manual_seed(out_features)
    weight = (torch.randn(out_features, in_features, generator=gen) / 32).bfloat16()
    rows = torch.randn(300, in_features, generator=gen).bfloat16()
    tiles = amx_linear.pack(weight)
    assert tiles is not None
    full = amx_linear.linear(rows, tiles)
    want = rows.float() @ weight.float().T  # float32 sums of the same bfloat16 inputs
    torch.testing.assert_close(full.float(), want, rtol=1e-2, atol=2e-2)
    for start, count in ((0, 1), (0, 31), (0, 32), (0, 33), (5, 64), (100, 200), (299, 1)):
        assert torch.equal(amx_linear.linear(rows[start:start + count], tiles),
                           full[start:start + count])
    assert amx_linear.linear(rows[:0], tiles).shape == (0, out_features)


def test_packed_bfloat16_linears_take_the_tiles_where_they_fit(amx):
    gen = torch.Generator().manual_seed(0)
    fits = (torch.randn(64, 96, generator=gen)).bfloat16()
    assert isinstance(packed_linear.pack_weight(fits), amx_linear.AmxWeight)
    for weight, bias in (((torch.randn(64, 40, generator=gen)).bfloat16(), None),  # K % 32
                         ((torch.randn(40, 64, generator=gen)).bfloat16(), None),  # N % 16
                         (fits, torch.zeros(64).bfloat16()),  # a bias: oneDNN adds it
                         (fits.float(), None)):
        assert amx_linear.pack(weight, bias) is None
    x = torch.randn(5, 96, generator=gen).bfloat16()
    tiles = packed_linear.pack_weight(fits)
    assert torch.equal(packed_linear.linear_pointwise(x, tiles), amx_linear.linear(x, tiles))


def test_bad_shapes_raise_and_name_the_argument(amx):
    tiles = amx_linear.pack(torch.randn(32, 64).bfloat16())
    assert tiles is not None
    with pytest.raises(RuntimeError, match="rows"):
        amx_linear.linear(torch.randn(3, 64), tiles)  # float32 rows
    with pytest.raises(RuntimeError, match="packed"):
        amx_linear.linear(torch.randn(3, 96).bfloat16(), tiles)  # K disagrees
