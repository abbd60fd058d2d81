"""Skinny GEMM (few rows, all SMs streaming weights) against F.linear: fp16 under the
Triton interpreter on CPU, bf16 on CUDA; ragged K (masked tail), bias, every row count
up to the block, and a strided x (a row slice of a wider buffer); the gated product (the
MLP's SiLU-and-mul in the same launch) against the unfused torch path; the TMA tilings
(tensor descriptors; the interpreter runs them in fp16) and their fallback."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gearshift.kernels.reference import rms_norm_ref, silu_and_mul_ref
from gearshift.kernels.skinny_gemm import SkinnyConfig, skinny_linear

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
    # 64 rows over 128-column blocks (bench_skinny's widest tiling), N ragged in the last block
    _check(64, 300, 128, torch.float16, bias=True, config=SkinnyConfig(block_m=64, block_n=128, block_k=64))


def test_rows_beyond_one_block_tile_over_m():
    """More rows than a block: row blocks tile M (the last one ragged), for mid-size GEMMs."""
    _check(37, 48, 96, torch.float16, bias=True, config=SMALL)
    _check(70, 33, 64, torch.float16, bias=False, config=SkinnyConfig(block_m=32, block_n=16, block_k=32))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [96, 70])  # even and ragged K
def test_gated_product_applies_silu_and_mul(dtype, k):
    """W = [gate; up] ([2N, K]) -> silu(x @ gate.T) * (x @ up.T): [M, N], N ragged."""
    g = torch.Generator().manual_seed(k)
    x = torch.randn(3, k, generator=g).to(DEVICE, dtype)
    w = (torch.randn(2 * 21, k, generator=g) / k**0.5).to(DEVICE, dtype)
    got = skinny_linear(x, w, config=SMALL, gated=True)
    assert got.shape == (3, 21)
    torch.testing.assert_close(got.float(), silu_and_mul_ref(F.linear(x.float(), w.float())),
                               rtol=1e-2, atol=1e-2)
    with pytest.raises(AssertionError, match="no bias"):
        skinny_linear(x, w, w[:, 0], config=SMALL, gated=True)


TMA = SkinnyConfig(block_m=16, block_n=16, block_k=32, tma=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 3, 16, 37])
def test_tma_tiling_matches_linear(dtype, m):
    """x and W through tensor descriptors: rows past M and K past the end read as zero;
    more rows than BLOCK_M run several row blocks (37: three, the last one ragged)."""
    _check(m, 48, 96, dtype, bias=False, config=TMA)
    _check(m, 37, 72, dtype, bias=True, config=TMA)  # ragged K and N, bias


@pytest.mark.parametrize("dtype", DTYPES)
def test_tma_gated_product(dtype):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 72, generator=g).to(DEVICE, dtype)
    w = (torch.randn(2 * 21, 72, generator=g) / 72**0.5).to(DEVICE, dtype)
    got = skinny_linear(x, w, config=TMA, gated=True)
    torch.testing.assert_close(got.float(), silu_and_mul_ref(F.linear(x.float(), w.float())),
                               rtol=1e-2, atol=1e-2)


def test_tma_tiling_falls_back_for_an_unaligned_x():
    """A row stride the descriptor cannot take (65 fp16 = 130 bytes) runs the pointer kernel
    with the same tiles: same product."""
    from gearshift.kernels.skinny_gemm import tma_ready

    x = torch.randn(4, 65, dtype=torch.float16)[:, :64]
    assert not tma_ready(x) and tma_ready(x.contiguous())
    _check(4, 32, 64, torch.float16, bias=False, config=TMA, x_stride_pad=1)


def test_tma_candidates_only_where_the_gpu_has_tma(monkeypatch):
    from gearshift.kernels import skinny_select as sel

    cpu = torch.device("cpu")
    assert not sel.tma_capable(cpu)
    for rows in (1, 32, 64):
        assert not any(c.tma for c in sel.candidates(rows, cpu))
    assert sel.candidates(64, cpu, "rms") == ()  # the norm inside: TMA kernels only
    monkeypatch.setattr(sel, "tma_capable", lambda device: True)
    assert any(c.tma for c in sel.candidates(64, cpu))
    assert sel.candidates(64, cpu, "gated_rms") and all(c.tma for c in sel.candidates(64, cpu, "rms"))
    assert sel._name(TMA).endswith("_tma") and not sel._name(SMALL).endswith("_tma")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gated", [False, True])
def test_rms_inside_the_product(dtype, gated):
    """rms=(unit weight, eps) with the norm weight g folded into W: the product of
    rms_norm(x, g) with the unfolded W. TMA tilings compute rstd in the kernel; a pointer
    tiling runs the norm kernel first."""

    g = torch.Generator().manual_seed(11 + gated)
    m, n, k = 3, 21, 64
    x = (4 * torch.randn(m, k, generator=g)).to(DEVICE, dtype)
    w = (torch.randn(2 * n if gated else n, k, generator=g) / k**0.5).to(DEVICE, dtype)
    gain = (1 + 0.2 * torch.randn(k, generator=g)).to(DEVICE, dtype)
    b = None if gated else torch.randn(n, generator=g).to(DEVICE, dtype)
    folded = (w.float() * gain.float()[None, :]).to(dtype)
    ref = F.linear(rms_norm_ref(x.float(), gain.float(), 1e-6), w.float(), None if b is None else b.float())
    if gated:
        ref = silu_and_mul_ref(ref)
    ones = torch.ones(k, device=DEVICE, dtype=dtype)
    for config in (TMA, SMALL):
        got = skinny_linear(x, folded, b, config=config, gated=gated, rms=(ones, 1e-6))
        torch.testing.assert_close(got.float(), ref, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_accumulate_adds_into_out(dtype):
    """accumulate: out += x @ W.T in place (the residual stream), both kernels."""
    g = torch.Generator().manual_seed(13)
    x = torch.randn(5, 72, generator=g).to(DEVICE, dtype)
    w = (torch.randn(40, 72, generator=g) / 72**0.5).to(DEVICE, dtype)
    r = torch.randn(5, 40, generator=g).to(DEVICE, dtype)
    for config in (TMA, SMALL):
        out = r.clone()
        assert skinny_linear(x, w, config=config, out=out, accumulate=True) is out
        torch.testing.assert_close(out.float(), r.float() + F.linear(x.float(), w.float()),
                                   rtol=1e-2, atol=1e-2)
    with pytest.raises(AssertionError, match="accumulate"):
        skinny_linear(x, w, config=SMALL, accumulate=True)


def test_ops_gated_linear_is_the_mlp_activation():
    """ops.gated_linear (the MLP's call) = silu_and_mul(gate_up(x)), on either device."""
    from gearshift.kernels import ops

    dtype = torch.bfloat16 if HAS_CUDA else torch.float32
    layer = torch.nn.Linear(64, 2 * 48, bias=False).to(DEVICE, dtype).requires_grad_(False)
    x = torch.randn(3, 64, device=DEVICE, dtype=dtype)
    tol = dict(rtol=2e-2, atol=2e-2) if HAS_CUDA else dict(rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ops.gated_linear(x, layer), ops.silu_and_mul(layer(x)), **tol)


def test_linear_writes_into_out(monkeypatch):
    """ops.linear(out=...) (the logits' buffer): the product lands in `out`, on the kernel
    path and on the torch one; a bias is refused there."""
    from gearshift.kernels import ops

    layer = torch.nn.Linear(64, 48, bias=False).to(DEVICE, torch.float16).requires_grad_(False)
    x = torch.randn(3, 64, device=DEVICE, dtype=torch.float16)
    out = torch.full((3, 48), float("nan"), device=DEVICE, dtype=torch.float16)
    assert ops.linear(x, layer, out=out) is out
    torch.testing.assert_close(out, F.linear(x, layer.weight), rtol=1e-2, atol=1e-2)
    with pytest.raises(AssertionError, match="without bias"):
        ops.linear(x.cpu(), torch.nn.Linear(64, 48).half().requires_grad_(False), out=out.cpu())


def test_kernel_margin_is_wider_under_pdl(monkeypatch):
    """Where our kernels launch under PDL, the chooser takes one within 10% of the cuBLAS
    form (timed alone it cannot show the overlap it gets in the step); elsewhere it must
    beat cuBLAS by 3%. cuBLASLt against cuBLAS keeps the 3% either way."""
    from gearshift.kernels import skinny_select as sel

    cfg = SkinnyConfig(16, 32, 256, 4, 4)
    ran, pdl_on = [], [False]

    def fake_linear(x, w, b=None, *, config, **fusions):
        ran.append(config)

    def fake_time(fn):
        ran.clear()
        fn()
        return 1.05 if ran else 1.0  # the kernel 5% behind cuBLAS, alone

    monkeypatch.setattr(sel, "CANDIDATES", {16: (cfg,)})
    monkeypatch.setattr(sel, "skinny_linear", fake_linear)
    monkeypatch.setattr(sel.pdl, "enabled", lambda device: pdl_on[0])
    chooser = sel.SkinnyChooser("auto")
    monkeypatch.setattr(chooser, "_time", fake_time)
    w = torch.zeros(64, 32, dtype=torch.float16)
    key = (1, 64, 32, torch.float16, False, "plain")
    assert sel.kernel_margin(w.device) == sel.SKINNY_MARGIN == 0.97
    assert chooser._measure(key, w, None) is None  # without PDL: cuBLAS
    pdl_on[0] = True
    assert sel.kernel_margin(w.device) == sel.PDL_KERNEL_MARGIN == 1.10
    assert chooser._measure(key, w, None) is cfg  # under PDL: the kernel


def test_chooser_modes(monkeypatch):
    from gearshift.kernels.skinny_select import SkinnyChooser, row_bucket

    with pytest.raises(ValueError, match="GEARSHIFT_SKINNY_GEMM"):
        SkinnyChooser("fast")
    monkeypatch.setenv("GEARSHIFT_SKINNY_GEMM", "Off")  # read when a chooser is built
    assert SkinnyChooser().mode == "off" and SkinnyChooser("on").mode == "on"
    monkeypatch.setenv("GEARSHIFT_SKINNY_GEMM", "fast")
    with pytest.raises(ValueError, match="GEARSHIFT_SKINNY_GEMM"):
        SkinnyChooser()
    monkeypatch.delenv("GEARSHIFT_SKINNY_GEMM")
    assert SkinnyChooser().mode == "auto"
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


def test_chooser_skips_a_tiling_that_does_not_fit(monkeypatch):
    """A candidate that Triton cannot compile for this GPU (OutOfResources: too much shared
    memory) is timed as inf and never chosen; the others are still compared with cuBLAS."""
    from triton.runtime.errors import OutOfResources

    from gearshift.kernels import skinny_select as sel

    big, fits, slow = SkinnyConfig(16, 128, 512, 8, 5), SkinnyConfig(16, 32, 256, 4, 4), SMALL
    ms = {None: 1.0, big: 0.1, fits: 0.9, slow: 2.0}  # big would win if it compiled
    ran = []

    def fake_linear(x, w, b=None, *, config, **fusions):
        if config is big:
            raise OutOfResources(300_000, 232_448, "shared memory")
        ran.append(config)

    def fake_time(fn):
        ran.clear()
        fn()
        return ms[ran[0] if ran else None]

    monkeypatch.setattr(sel, "CANDIDATES", {16: (big, fits, slow)})
    monkeypatch.setattr(sel, "skinny_linear", fake_linear)
    chooser = sel.SkinnyChooser("auto")
    monkeypatch.setattr(chooser, "_time", fake_time)
    w = torch.zeros(64, 32, dtype=torch.float16)
    key = (8, 64, 32, torch.float16, False, "plain")
    assert chooser._measure(key, w, None) is fits
    assert chooser.timings[key] == {
        "cublas": 1.0, sel._name(big): float("inf"), sel._name(fits): 0.9, sel._name(slow): 2.0}
    ms[fits] = 0.99  # not 3% under cuBLAS: cuBLAS
    assert chooser._measure(key, w, None) is None
    monkeypatch.setattr(sel, "CANDIDATES", {16: (big,)})  # nothing fits: cuBLAS
    assert chooser._measure(key, w, None) is None


def test_chooser_times_in_interleaved_rounds_and_keeps_the_fastest(monkeypatch):
    """A slow first timing (the GPU's clocks still ramping) must not decide: candidates are
    timed in turn, twice, and each keeps its fastest. Here cuBLAS reads 2.0 then 1.0 and
    the kernel 1.5 twice: cuBLAS wins (one round alone would have picked the kernel)."""
    from gearshift.kernels import skinny_select as sel

    cfg = SkinnyConfig(16, 32, 256, 4, 4)
    order, readings = [], {None: [2.0, 1.0], cfg: [1.5, 1.5]}
    ran = []

    def fake_linear(x, w, b=None, *, config, **fusions):
        ran.append(config)

    def fake_time(fn):
        ran.clear()
        fn()
        who = ran[0] if ran else None
        order.append(who)
        return readings[who].pop(0)

    monkeypatch.setattr(sel, "CANDIDATES", {16: (cfg,)})
    monkeypatch.setattr(sel, "skinny_linear", fake_linear)
    chooser = sel.SkinnyChooser("auto")
    monkeypatch.setattr(chooser, "_time", fake_time)
    key = (1, 64, 32, torch.float16, False, "plain")
    assert chooser._measure(key, torch.zeros(64, 32, dtype=torch.float16), None) is None
    assert order == [None, cfg, None, cfg]
    assert chooser.timings[key] == {"cublas": 1.0, sel._name(cfg): 1.5}



def test_chooser_times_cublaslt_and_runs_the_cublas_form_under_it(monkeypatch):
    """Where torch can switch to cuBLASLt, the cuBLAS form is timed through it too: taken by
    the margin over cuBLAS, and then the kernel must beat cuBLASLt by the margin. The
    wrappers run the chosen form with cuBLASLt preferred for that call only."""
    from gearshift.kernels import skinny_select as sel

    cfg = SkinnyConfig(16, 32, 256, 4, 4)
    ran, state = [], ["cublas"]

    def lib(backend=None):  # torch's switch (a CPU build cannot select cuBLASLt)
        if backend is not None:
            state.append(backend)
        return state[-1]

    monkeypatch.setattr(torch.backends.cuda, "preferred_blas_library", lib)

    def fake_linear(x, w, b=None, *, config, **fusions):
        ran.append(config)

    def fake_time(fn):
        ran.clear()
        settings = len(state)
        fn()
        under_lt = "cublaslt" in state[settings:]  # set during the call
        return timing["kernel" if ran else "lt" if under_lt else "cublas"]

    monkeypatch.setattr(sel, "CANDIDATES", {16: (cfg,)})
    monkeypatch.setattr(sel, "skinny_linear", fake_linear)
    monkeypatch.setattr(sel, "lt_available", lambda device: True)
    chooser = sel.SkinnyChooser("auto")
    monkeypatch.setattr(chooser, "_time", fake_time)
    key = (1, 64, 32, torch.float16, False, "acc")
    w = torch.zeros(64, 32, dtype=torch.float16)
    for timing, want in (  # noqa: B007 (fake_time reads `timing`)
            ({"cublas": 1.0, "lt": 0.9, "kernel": 0.95}, sel.CUBLASLT),
            ({"cublas": 1.0, "lt": 0.9, "kernel": 0.8}, cfg),
            ({"cublas": 1.0, "lt": 0.99, "kernel": 0.99}, None)):
        assert chooser._measure(key, w, None) == want
    assert set(chooser.timings[key]) == {"cublas", sel.CUBLASLT, sel._name(cfg)}
    assert lib() == "cublas"  # restored after timing

    seen = []
    monkeypatch.setattr(chooser, "choose", lambda *a, **k: sel.CUBLASLT)
    monkeypatch.setattr(sel, "CHOOSER", chooser)
    monkeypatch.setattr(sel, "linear_ref", lambda *a: seen.append(lib()) or a[0])
    x = torch.zeros(2, 32, dtype=torch.float16)
    sel.linear(x, w)
    assert seen == ["cublaslt"] and lib() == "cublas"
