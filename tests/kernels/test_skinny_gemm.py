"""Skinny GEMM (few rows, all SMs streaming weights) against F.linear: fp16 under the
Triton interpreter on CPU, bf16 on CUDA; ragged K (masked tail), bias, every row count
up to the block, a strided x (a row slice of a wider buffer), and the fused prologues
(residual add + RMSNorm, SiLU-and-mul) against the unfused ops."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gearshift.models.kernels.skinny_gemm import (
    SkinnyConfig,
    skinny_add_norm_linear,
    skinny_linear,
    skinny_silu_linear,
)
from gearshift.models.reference_ops import fused_add_rms_norm_ref, rms_norm_ref, silu_and_mul_ref

HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"
DTYPES = [
    pytest.param(torch.float16, id="fp16"),
    pytest.param(torch.bfloat16, id="bf16",
                 marks=pytest.mark.skipif(not HAS_CUDA, reason="bf16 needs CUDA")),
]
SMALL = SkinnyConfig(block_m=16, block_n=16, block_k=32)


def _check(m: int, n: int, k: int, dtype: torch.dtype, *, bias: bool, config: SkinnyConfig,
           x_stride_pad: int = 0) -> None:
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    x_full = torch.randn(m, k + x_stride_pad, generator=g).to(DEVICE, dtype)
    x = x_full[:, :k]
    w = (torch.randn(n, k, generator=g) / k**0.5).to(DEVICE, dtype)
    b = torch.randn(n, generator=g).to(DEVICE, dtype) if bias else None
    got = skinny_linear(x, w, b, config=config)
    ref = F.linear(x.float(), w.float(), None if b is None else b.float())
    assert got.shape == (m, n) and got.dtype == dtype
    # one rounding of an fp32 accumulation: within half an ulp of the output dtype, plus the
    # accumulation-order differences of fp32 sums
    torch.testing.assert_close(got.float(), ref, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 3, 16])
def test_matches_linear(dtype, m):
    _check(m, 48, 96, dtype, bias=False, config=SMALL)


@pytest.mark.parametrize("dtype", DTYPES)
def test_ragged_k_and_n_with_bias(dtype):
    _check(5, 37, 70, dtype, bias=True, config=SMALL)


def test_strided_rows():
    _check(4, 32, 64, torch.float16, bias=False, config=SMALL, x_stride_pad=8)


def test_wider_row_block():
    _check(20, 32, 64, torch.float16, bias=True, config=SkinnyConfig(block_m=32, block_n=16, block_k=32))


def test_too_many_rows_is_refused():
    x = torch.zeros(17, 32, device=DEVICE, dtype=torch.float16)
    w = torch.zeros(16, 32, device=DEVICE, dtype=torch.float16)
    with pytest.raises(AssertionError, match="at most 16 rows"):
        skinny_linear(x, w, config=SMALL)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("has_residual", [True, False], ids=["add_norm", "norm"])
@pytest.mark.parametrize("k", [64, 70], ids=["even_k", "ragged_k"])
def test_add_norm_prologue_matches_unfused(dtype, has_residual, k):
    """One launch of add + RMSNorm + projection equals fused_add_rms_norm then F.linear:
    the normalised input is rounded where the norm kernel rounds it, so the products agree
    to the accumulation order; the new residual is exactly x + residual."""
    m, n = 3, 40
    g = torch.Generator().manual_seed(k)
    x = torch.randn(m, k, generator=g).to(DEVICE, dtype)
    res = torch.randn(m, k, generator=g).to(DEVICE, dtype) if has_residual else None
    norm_w = (1 + 0.1 * torch.randn(k, generator=g)).to(DEVICE, dtype)
    w = (torch.randn(n, k, generator=g) / k**0.5).to(DEVICE, dtype)
    b = torch.randn(n, generator=g).to(DEVICE, dtype)
    res_before = None if res is None else res.clone()
    out, new_res = skinny_add_norm_linear(x, res, norm_w, 1e-6, w, b, config=SMALL)
    if has_residual:
        h, ref_res = fused_add_rms_norm_ref(x, res, norm_w, 1e-6)
        torch.testing.assert_close(new_res, ref_res, rtol=0, atol=0)
        torch.testing.assert_close(res, res_before, rtol=0, atol=0)  # not updated in place
    else:
        h = rms_norm_ref(x, norm_w, 1e-6)
    torch.testing.assert_close(out.float(), F.linear(h.float(), w.float(), b.float()),
                               rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_prologue_matches_unfused(dtype):
    m, n, k = 4, 48, 64
    g = torch.Generator().manual_seed(7)
    gate_up = torch.randn(m, 2 * k, generator=g).to(DEVICE, dtype)
    w = (torch.randn(n, k, generator=g) / k**0.5).to(DEVICE, dtype)
    out = skinny_silu_linear(gate_up, w, config=SMALL)
    ref = F.linear(silu_and_mul_ref(gate_up).float(), w.float())
    torch.testing.assert_close(out.float(), ref, rtol=1e-2, atol=1e-2)


def test_chooser_modes():
    from gearshift.models.kernels.skinny_select import SkinnyChooser, row_bucket

    with pytest.raises(ValueError, match="GEARSHIFT_SKINNY_GEMM"):
        SkinnyChooser("fast")
    assert [row_bucket(m) for m in (1, 2, 3, 5, 16, 17, 64)] == [1, 2, 4, 8, 16, 32, 64]
    x = torch.zeros(2, 32, dtype=torch.float16)
    w = torch.zeros(16, 32, dtype=torch.float16)
    assert SkinnyChooser("on").choose(x, w, None) is None  # CPU tensors: never the kernel
    if HAS_CUDA:
        on = SkinnyChooser("on")
        assert on.choose(x.cuda(), w.cuda(), None) is not None
        assert on.choose(x.cuda().float(), w.cuda().float(), None) is None  # fp32: cuBLAS
        assert on.choose(torch.zeros(65, 32, device="cuda", dtype=torch.float16), w.cuda(), None) is None
        assert SkinnyChooser("off").choose(x.cuda(), w.cuda(), None) is None
