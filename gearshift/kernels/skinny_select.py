"""Which GEMM runs `F.linear` for few rows on this GPU: the skinny Triton kernel or cuBLAS,
measured once per (row bucket, N, K, dtype, bias) the first time a shape runs eagerly (the
CUDA-graph warm-up runs do that before capture), never during a capture.

Why measured: which one wins depends on the GPU's SM count and on cuBLAS's tile choice
for the shape (it loses only where its tiles leave SMs idle), so no table is written by
hand. Each candidate is timed inside a CUDA graph, each call after evicting L2 by reading
a 256 MB buffer. Both matter: timed eagerly, the host's launch latency counts (a Triton
launch costs more host time than a short GEMV); evicted by a write (zero_()), dirty lines
are written back during the timed call, which inflated cuBLAS's times well past what it
takes inside the model. The kernel is taken only when it beats cuBLAS by SKINNY_MARGIN
(3%), or, where it launches under PDL, is within PDL_KERNEL_MARGIN (10%) of it
(`kernel_margin`). A candidate tiling that does not fit the GPU (Triton's OutOfResources
at compile time) is skipped, timed as inf.

GEARSHIFT_SKINNY_GEMM (gearshift/env.py): `auto` (default: measure), `off` (always
cuBLAS), `on` (always the kernel's first candidate, for tests).

Kinds of product: `plain` (F.linear), `gated` (the MLP's silu_and_mul(F.linear(x))),
`rms` / `gated_rms` (of rms_norm(x), the norm weight folded into W; TMA tilings only) and
`acc` (out += x @ W.T, the residual stream). Each kind is timed against its cuBLAS form
(+ the SiLU kernel, the norm kernel first, `addmm_`), so a fusion is taken where the
launch it saves outweighs the kernel's loss to cuBLAS.

Each kind's cuBLAS form is also timed through cuBLASLt (CUBLASLT) where torch can switch
to it, and taken by the same margin.

Data flow: models/ops.linear / gated_linear / rms_linear / linear_accumulate ->
choose(x, weight, bias, kind) -> SkinnyConfig | None (the cuBLAS form) | CUBLASLT (the
cuBLAS form through cuBLASLt).
"""

from __future__ import annotations

import statistics
import time

import torch
from triton.runtime.errors import OutOfResources

from gearshift import env
from gearshift.kernels import pdl
from gearshift.kernels.activation import silu_and_mul
from gearshift.kernels.norm import rms_norm
from gearshift.kernels.reference import linear_ref
from gearshift.kernels.skinny_gemm import SkinnyConfig, TensorDescriptor, skinny_linear

# products of more rows run their cuBLAS forms (the TMA tilings measured no faster than
# cuBLAS at 128-512 rows); the fused decoder path itself runs at any size
MAX_ROWS = 64
# a choice must take <= SKINNY_MARGIN x the time of the one it replaces: cuBLASLt against
# cuBLAS, and the kernel against the cuBLAS form where kernels launch plainly (a margin of
# 1.0 or 1.03 gained nothing over run-to-run spread)
SKINNY_MARGIN = 0.97
# the kernel against the cuBLAS form where our kernels launch under PDL (kernels/pdl.py).
# Timed alone, such a kernel cannot show what it gains inside the step: it launches during
# the previous kernel's tail and prefetches its weights into L2 there, which cuBLAS's
# kernels do not. Taking the kernel within 10% raised offline throughput a little in every
# A/B pair, and left batch 1 unchanged.
PDL_KERNEL_MARGIN = 1.10


def kernel_margin(device: torch.device) -> float:
    """The margin the kernel must meet against the cuBLAS form on `device`."""
    return PDL_KERNEL_MARGIN if pdl.enabled(device) else SKINNY_MARGIN


_REPEATS = 10
_ROUNDS = 2
_DTYPES = (torch.float16, torch.bfloat16)
# plain: F.linear; gated: + SiLU-and-mul; rms / gated_rms: of rms_norm(x), the norm weight
# folded into W (TMA tilings only); acc: out += x @ W.T (the residual stream)
KINDS = ("plain", "gated", "rms", "gated_rms", "acc")
# a choice: the cuBLAS form through cuBLASLt (torch.backends.cuda.preferred_blas_library),
# timed beside torch's default back end: at 64 rows cuBLASLt ran some of the 8B's
# products (down, gate_up) faster than cuBLAS and the skinny kernel, others equally.
CUBLASLT = "cublaslt"
_RMS_KINDS = ("rms", "gated_rms")
# per row block: a few tilings, the first ones the fastest in a microbenchmark of 8B
# shapes (benchmarks/bench_skinny.py). The wide 8-warp tiling is the one 64-row tiling to
# beat cuBLAS by the margin on the 8B's lm_head; at 32 rows it is a guess the measurement
# settles. The 4-warp 64- / 128-column ones won gate_up at 64 rows (a gated product loads
# twice the weight rows a column). 6 stages led at one row for o_proj / down; the TMA
# tilings led at 64 rows for qkv / o_proj / down and at one row for gate_up; the 32-row
# TMA ones are guesses between the two. TMA tilings are only timed where the GPU has TMA
# (`tma_capable`).
CANDIDATES: dict[int, tuple[SkinnyConfig, ...]] = {
    16: (SkinnyConfig(16, 32, 256, 4, 4), SkinnyConfig(16, 16, 256, 4, 4),
         SkinnyConfig(16, 32, 128, 4, 4), SkinnyConfig(16, 32, 256, 4, 6),
         SkinnyConfig(16, 128, 128, 4, 4, tma=True), SkinnyConfig(16, 128, 256, 4, 4, tma=True)),
    32: (SkinnyConfig(32, 32, 128, 4, 4), SkinnyConfig(32, 16, 256, 4, 4),
         SkinnyConfig(32, 128, 128, 8, 4), SkinnyConfig(32, 64, 128, 4, 4),
         SkinnyConfig(32, 64, 128, 4, 6, tma=True), SkinnyConfig(32, 32, 256, 4, 4, tma=True)),
    64: (SkinnyConfig(64, 32, 128, 4, 4), SkinnyConfig(64, 16, 128, 4, 4),
         SkinnyConfig(64, 128, 128, 8, 4), SkinnyConfig(64, 64, 128, 4, 4),
         SkinnyConfig(64, 128, 128, 4, 4), SkinnyConfig(64, 64, 128, 4, 6, tma=True),
         SkinnyConfig(64, 32, 256, 4, 4, tma=True), SkinnyConfig(64, 64, 128, 4, 4, tma=True)),
}


def tma_capable(device: torch.device) -> bool:
    """Tensor-memory-accelerator loads: a CUDA GPU of compute capability >= 9 and a Triton
    with host tensor descriptors."""
    return (device.type == "cuda" and TensorDescriptor is not None
            and torch.cuda.get_device_capability(device)[0] >= 9)


def candidates(rows: int, device: torch.device, kind: str = "plain") -> tuple[SkinnyConfig, ...]:
    """The tilings timed for a product of `rows` rows on `device` (the norm inside the
    product has a TMA kernel only)."""
    tma = tma_capable(device)
    return tuple(c for c in CANDIDATES[row_block(rows)]
                 if (tma or not c.tma) and (c.tma or kind not in _RMS_KINDS))


def row_block(m: int) -> int:
    return 16 if m <= 16 else 32 if m <= 32 else 64


def row_bucket(m: int) -> int:
    """Rows are timed at the top of their bucket: 1, 2, 4, 8, 16, 32, 64."""
    return 1 << max(0, (m - 1).bit_length())


class SkinnyChooser:
    def __init__(self, mode: str | None = None) -> None:
        self.mode = env.SKINNY_GEMM.get(mode)  # `mode`, else GEARSHIFT_SKINNY_GEMM
        self.table: dict[tuple, SkinnyConfig | str | None] = {}
        self.timings: dict[tuple, dict[str, float]] = {}  # key -> {candidate: ms per call}
        self.skipped_in_capture = 0
        self._flush: torch.Tensor | None = None
        self._evict_ms: float | None = None
        # tensor parallelism (distributed/comm.py): choice -> rank 0's choice. Ranks run some
        # products replicated (the draft); the same kernel keeps their results bit-identical
        self.agree = None
        self.watch = None  # after the warm-up, a ServingWatch told of each measurement

    def choose(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               kind: str = "plain") -> SkinnyConfig | str | None:
        """The kernel config to run this product with, or its cuBLAS form (+ SiLU kernel):
        None (torch's default BLAS) or CUBLASLT (run it through `_under`)."""
        m = x.shape[0]
        if (self.mode == "off" or not x.is_cuda or x.dim() != 2 or m > MAX_ROWS or m == 0
                or x.dtype not in _DTYPES or x.stride(-1) != 1 or weight.stride(-1) != 1):
            return None
        if self.mode == "on":
            return next(iter(candidates(m, x.device, kind)), None)
        key = (row_bucket(m), weight.shape[0], weight.shape[1], x.dtype, bias is not None, kind)
        if key in self.table:
            return self.table[key]
        if torch.cuda.is_current_stream_capturing():
            self.skipped_in_capture += 1
            return None  # never time inside a capture; this graph keeps cuBLAS
        t0 = time.perf_counter()
        choice = self._measure(key, weight, bias)
        self.table[key] = choice if self.agree is None else self.agree(choice)
        if self.watch is not None:  # a step waited for this measurement
            self.watch.chose(key, (time.perf_counter() - t0) * 1e3)
        return self.table[key]

    def _measure(self, key: tuple, weight: torch.Tensor,
                 bias: torch.Tensor | None) -> SkinnyConfig | str | None:
        rows = key[0]
        if self._flush is None:
            self._flush = torch.zeros(64 << 20, dtype=torch.float32, device=weight.device)
        x = torch.randn(rows, weight.shape[1], device=weight.device, dtype=weight.dtype)
        cublas, kernel = _products(key[5], x, weight, bias)
        fns, times = {"cublas": cublas}, {}
        if lt_available(weight.device):
            fns[CUBLASLT] = lambda: _under(CUBLASLT, cublas)
        for cfg in candidates(rows, weight.device, key[5]):
            try:
                kernel(cfg)  # compile it (outside any capture)
            except OutOfResources:  # a tiling this GPU cannot hold (shared memory): skip it
                times[_name(cfg)] = float("inf")
                continue
            fns[_name(cfg)] = lambda cfg=cfg: kernel(cfg)
        # interleaved rounds, the fastest of each: a clock ramp or a slow replay during one
        # candidate's timing must not decide (cuBLAS, timed first, once read 30% slow and
        # lost to the kernel)
        for _ in range(_ROUNDS):
            self._evict_ms = None
            for name, fn in fns.items():
                times[name] = min(times.get(name, float("inf")), self._time(fn))
        self.timings[key] = times
        self._flush = None  # 256 MB: back to the allocator, not held for the process's life
        blas = CUBLASLT if times.get(CUBLASLT, float("inf")) <= SKINNY_MARGIN * times["cublas"] else None
        configs = [c for c in candidates(rows, weight.device, key[5]) if _name(c) in fns]
        if not configs:
            return blas
        best = min(configs, key=lambda c: times[_name(c)])
        margin = kernel_margin(weight.device)
        return best if times[_name(best)] <= margin * times[blas or "cublas"] else blas

    def _time(self, fn) -> float:
        """ms per call: _REPEATS x (evict L2, fn) captured in one CUDA graph, less the same
        graph without fn."""
        fn()  # compile / cuBLAS heuristics outside the capture
        if self._evict_ms is None:
            self._evict_ms = graph_ms(lambda: None, self._flush)
        return kernel_ms(fn, self._flush, self._evict_ms)

    def report(self) -> list[dict]:
        """One row per measured shape: the choice and each candidate's ms per call."""
        return [{"rows": k[0], "n": k[1], "k": k[2], "dtype": str(k[3]).removeprefix("torch."),
                 "bias": k[4], "kind": k[5],
                 "choice": (_name(self.table[k]) if isinstance(self.table[k], SkinnyConfig)
                            else self.table[k] or "cublas"),
                 "ms": self.timings.get(k, {})} for k in self.table]


def graph_ms(fn, flush: torch.Tensor, repeats: int = _REPEATS) -> float:
    """ms per (evict L2, fn): `repeats` of them captured in one CUDA graph, the median of
    three replays. The eviction reads `flush` (>= the L2 size; a read leaves no dirty
    lines to write back inside the timed call). kernel_ms takes the eviction's time out.
    Also used by the kernel micro-benchmarks in benchmarks/."""
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(repeats):
            flush.sum()  # read-only eviction
            fn()
    runs = []
    for _ in range(3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        runs.append(start.elapsed_time(end) / repeats)
    del graph
    return statistics.median(runs)


def kernel_ms(fn, flush: torch.Tensor, evict_ms: float) -> float:
    """ms per call of fn alone: graph_ms less the eviction's own time
    (evict_ms = graph_ms(lambda: None, flush)), floored at 0.1 us."""
    return max(graph_ms(fn, flush) - evict_ms, 1e-4)


def _name(cfg: SkinnyConfig) -> str:
    name = f"skinny_m{cfg.block_m}_n{cfg.block_n}_k{cfg.block_k}_w{cfg.num_warps}_s{cfg.num_stages}"
    return name + "_tma" if cfg.tma else name


def _products(kind: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
    """(the cuBLAS path, config -> the kernel) for one kind of product of x, as timed."""
    gated = kind in ("gated", "gated_rms")
    if kind == "acc":
        out = torch.zeros(x.shape[0], weight.shape[0], dtype=x.dtype, device=x.device)
        return (lambda: out.addmm_(x, weight.t()),
                lambda cfg: skinny_linear(x, weight, config=cfg, out=out, accumulate=True))
    rms = (torch.ones(x.shape[1], dtype=x.dtype, device=x.device), 1e-6) if kind in _RMS_KINDS else None
    return (lambda: _cublas(x, weight, bias, gated, rms),
            lambda cfg: skinny_linear(x, weight, bias, config=cfg, gated=gated, rms=rms))


def _cublas(x, weight, bias, gated, rms=None):
    if rms is not None:
        x = rms_norm(x, *rms)
    h = linear_ref(x, weight, bias)
    return silu_and_mul(h) if gated else h


def lt_available(device: torch.device) -> bool:
    """Can torch run a product through cuBLASLt here (a CUDA device; the switch exists)?"""
    return device.type == "cuda" and hasattr(torch.backends.cuda, "preferred_blas_library")


def _under(choice: str | None, fn, *args):
    """fn(*args), under cuBLASLt when `choice` is CUBLASLT: torch's BLAS preference is
    process-wide, so it is set for the call and restored (inside a capture the graph keeps
    the kernels chosen then)."""
    if choice != CUBLASLT:
        return fn(*args)
    before = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library("cublaslt")
    try:
        return fn(*args)
    finally:
        torch.backends.cuda.preferred_blas_library(before)


CHOOSER = SkinnyChooser()


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear over the last dim of x, through the skinny kernel where CHOOSER picks it.
    `out` ([rows, N], 2-D x, no bias): the product is written there (the logits' buffer)."""
    if x.dim() == 2:
        cfg = CHOOSER.choose(x, weight, bias)
        if isinstance(cfg, SkinnyConfig):
            return skinny_linear(x, weight, bias, config=cfg, out=out)
        return _under(cfg, linear_ref, x, weight, bias, out)
    return linear_ref(x, weight, bias, out)


def gated_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """silu_and_mul(F.linear(x, weight)) for the MLP's [gate; up] weight: one fused launch
    where CHOOSER picks the kernel, else cuBLAS and the SiLU kernel."""
    if x.dim() == 2:
        cfg = CHOOSER.choose(x, weight, None, "gated")
        if isinstance(cfg, SkinnyConfig):
            return skinny_linear(x, weight, config=cfg, gated=True)
        return _under(cfg, _cublas, x, weight, None, True)
    return _cublas(x, weight, None, True)


def rms_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               norm: tuple[torch.Tensor, float], gated: bool = False) -> torch.Tensor:
    """F.linear(rms_norm(x, *norm), weight, bias) (+ SiLU-and-mul when `gated`) for a
    weight with the norm's weight folded in (`norm`: the unit weight left behind, eps):
    one launch where CHOOSER picks the TMA kernel, else the norm kernel, then the product."""
    if x.dim() == 2:
        cfg = CHOOSER.choose(x, weight, bias, "gated_rms" if gated else "rms")
        if isinstance(cfg, SkinnyConfig):
            return skinny_linear(x, weight, bias, config=cfg, gated=gated, rms=norm)
        return _under(cfg, _cublas, x, weight, bias, gated, norm)
    return _cublas(x, weight, bias, gated, norm)


def linear_accumulate(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out += x @ weight.T in place (the residual stream): the skinny kernel's epilogue
    where CHOOSER picks it, else cuBLAS (addmm_, beta 1)."""
    cfg = CHOOSER.choose(x, weight, None, "acc") if x.dim() == 2 else None
    if isinstance(cfg, SkinnyConfig):
        return skinny_linear(x, weight, config=cfg, out=out, accumulate=True)
    return _under(cfg, out.addmm_, x, weight.t())
