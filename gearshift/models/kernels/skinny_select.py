"""Which GEMM runs `F.linear` for few rows on this GPU: the skinny Triton kernel or cuBLAS,
measured once per (row bucket, N, K, dtype, bias) the first time a shape runs eagerly (the
CUDA-graph warm-up runs do that before capture), never during a capture.

Why measured: which one wins depends on the GPU's SM count and on cuBLAS's tile choice
for the shape (it loses only where its tiles leave SMs idle), so no table is written by
hand. Each candidate is timed inside a CUDA graph (no host launch latency in the timing)
after evicting L2 by reading a 256 MB buffer (a write, such as zero_(), leaves dirty
lines whose write-back slows the timed run: session 5 measured cuBLAS's gate_up at 67 us
that way against 55 us inside the model);
the kernel is taken only when it beats cuBLAS by SKINNY_MARGIN.

The same measurement decides the fused variants (models/ops.add_norm_linear: residual add +
RMSNorm + the projection after it; ops.silu_linear: SiLU-and-mul + down_proj): one launch
against the norm / activation kernel followed by the product's own choice.

GEARSHIFT_SKINNY_GEMM: `auto` (default: measure), `off` (always the unfused ops and
cuBLAS), `on` (always the kernel's first candidate, for tests).

Data flow: models/ops.{linear, add_norm_linear, silu_linear} -> choose(x, weight, bias,
prologue) -> SkinnyConfig | None (unfused, cuBLAS).
"""

from __future__ import annotations

import os
import statistics

import torch
import torch.nn.functional as F

from gearshift.models.kernels.activation import silu_and_mul
from gearshift.models.kernels.norm import fused_add_rms_norm, rms_norm
from gearshift.models.kernels.skinny_gemm import (
    ADD_NORM,
    PLAIN,
    SILU,
    SkinnyConfig,
    skinny_add_norm_linear,
    skinny_linear,
    skinny_silu_linear,
)

MAX_ROWS = 64
MAX_FUSED_ROWS = 16  # the fused prologues re-read x per program: few rows only
SKINNY_MARGIN = 0.97  # the kernel must take <= 97% of cuBLAS's time
_REPEATS = 10
_DTYPES = (torch.float16, torch.bfloat16)
# per row block: a few tilings (session 5's H200 microbenchmark picked the first ones)
CANDIDATES: dict[int, tuple[SkinnyConfig, ...]] = {
    16: (SkinnyConfig(16, 32, 256, 4, 4), SkinnyConfig(16, 16, 256, 4, 4),
         SkinnyConfig(16, 32, 128, 4, 4)),
    32: (SkinnyConfig(32, 32, 128, 4, 4), SkinnyConfig(32, 16, 256, 4, 4)),
    64: (SkinnyConfig(64, 32, 128, 4, 4), SkinnyConfig(64, 16, 128, 4, 4)),
}
# the SiLU prologue holds gate, up and their fp32 products per tile: shorter K tiles
SILU_CANDIDATES = (SkinnyConfig(16, 32, 128, 4, 4), SkinnyConfig(16, 32, 64, 4, 4),
                   SkinnyConfig(16, 16, 128, 4, 4))


def row_block(m: int) -> int:
    return 16 if m <= 16 else 32 if m <= 32 else 64


def row_bucket(m: int) -> int:
    """Rows are timed at the top of their bucket: 1, 2, 4, 8, 16, 32, 64."""
    return 1 << max(0, (m - 1).bit_length())


class SkinnyChooser:
    def __init__(self, mode: str | None = None) -> None:
        mode = (mode or os.environ.get("GEARSHIFT_SKINNY_GEMM", "auto")).lower()
        if mode not in ("auto", "off", "on"):
            raise ValueError(f"GEARSHIFT_SKINNY_GEMM must be auto, off or on, not {mode!r}")
        self.mode = mode
        self.table: dict[tuple, SkinnyConfig | None] = {}
        self.timings: dict[tuple, dict[str, float]] = {}  # key -> {candidate: median ms}
        self.skipped_in_capture = 0
        self._flush: torch.Tensor | None = None
        self._evict_ms: float | None = None

    def choose(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               prologue: int = PLAIN, has_residual: bool = False) -> SkinnyConfig | None:
        """The kernel config to run this product with (`prologue`: fused into the same
        launch), or None: the unfused ops and cuBLAS."""
        m = x.shape[0]
        max_rows = MAX_ROWS if prologue == PLAIN else MAX_FUSED_ROWS
        if (self.mode == "off" or not x.is_cuda or x.dim() != 2 or m > max_rows or m == 0
                or x.dtype not in _DTYPES or x.stride(-1) != 1 or weight.stride(-1) != 1):
            return None
        if self.mode == "on":
            return _candidates(prologue, m)[0]
        key = (prologue, has_residual, row_bucket(m), weight.shape[0], weight.shape[1],
               x.dtype, bias is not None)
        if key in self.table:
            return self.table[key]
        if torch.cuda.is_current_stream_capturing():
            self.skipped_in_capture += 1
            return None  # never time inside a capture; this graph keeps cuBLAS
        self.table[key] = self._measure(key, weight, bias)
        return self.table[key]

    def _measure(self, key: tuple, weight: torch.Tensor, bias: torch.Tensor | None) -> SkinnyConfig | None:
        prologue, has_residual, rows = key[:3]
        n, k = weight.shape
        dev, dt = weight.device, weight.dtype
        if self._flush is None:
            self._flush = torch.zeros(64 << 20, dtype=torch.float32, device=dev)
        configs = _candidates(prologue, rows)
        if prologue == PLAIN:
            x = torch.randn(rows, k, device=dev, dtype=dt)
            runs = {"cublas": lambda: F.linear(x, weight, bias)}
            for cfg in configs:
                runs[_name(cfg)] = lambda cfg=cfg: skinny_linear(x, weight, bias, config=cfg)
        elif prologue == ADD_NORM:
            x = torch.randn(rows, k, device=dev, dtype=dt)
            res = torch.randn(rows, k, device=dev, dtype=dt) if has_residual else None
            g = torch.ones(k, device=dev, dtype=dt)
            linear(x, weight, bias)  # settle the unfused product's own choice first
            runs = {"unfused": lambda: _add_norm_unfused(x, res, g, 1e-6, weight, bias)}
            for cfg in configs:
                runs[_name(cfg)] = lambda cfg=cfg: skinny_add_norm_linear(
                    x, res, g, 1e-6, weight, bias, config=cfg)
        else:
            gate_up = torch.randn(rows, 2 * k, device=dev, dtype=dt)
            linear(gate_up[:, :k].contiguous(), weight, bias)
            runs = {"unfused": lambda: linear(silu_and_mul(gate_up), weight, bias)}
            for cfg in configs:
                runs[_name(cfg)] = lambda cfg=cfg: skinny_silu_linear(gate_up, weight, bias, config=cfg)
        times = {name: self._time(fn) for name, fn in runs.items()}
        self.timings[key] = times
        baseline = times["cublas" if prologue == PLAIN else "unfused"]
        best = min((c for c in configs), key=lambda c: times[_name(c)])
        return best if times[_name(best)] <= SKINNY_MARGIN * baseline else None

    def _time(self, fn) -> float:
        """Host-free timing: _REPEATS x (evict L2, fn) captured in one CUDA graph,
        less the same graph without fn, per call. Eager launches would time the host's
        launch latency too (a Triton launch costs more host time than a 15 us GEMV)."""
        fn()  # compile / cuBLAS heuristics outside the capture
        if self._evict_ms is None:
            self._evict_ms = self._graph_ms(lambda: None)
        return max(self._graph_ms(fn) - self._evict_ms, 1e-4)

    def _graph_ms(self, fn) -> float:
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(_REPEATS):
                self._flush.sum()  # read-only eviction
                fn()
        runs = []
        for _ in range(3):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            runs.append(start.elapsed_time(end) / _REPEATS)
        del graph
        return statistics.median(runs)

    def report(self) -> list[dict]:
        """One row per measured shape: the choice and each candidate's median ms."""
        kinds = {PLAIN: "linear", ADD_NORM: "add_norm+linear", SILU: "silu+linear"}
        return [{"op": kinds[k[0]] + ("" if k[0] != ADD_NORM or k[1] else " (no residual)"),
                 "rows": k[2], "n": k[3], "k": k[4], "dtype": str(k[5]).removeprefix("torch."),
                 "bias": k[6], "choice": _name(self.table[k]) if self.table[k] else "unfused",
                 "ms": self.timings.get(k, {})} for k in self.table]


def _candidates(prologue: int, rows: int) -> tuple[SkinnyConfig, ...]:
    return SILU_CANDIDATES if prologue == SILU else CANDIDATES[row_block(rows)]


def _name(cfg: SkinnyConfig) -> str:
    return f"skinny_m{cfg.block_m}_n{cfg.block_n}_k{cfg.block_k}_w{cfg.num_warps}_s{cfg.num_stages}"


CHOOSER = SkinnyChooser()


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear over the last dim of x, through the skinny kernel where CHOOSER picks it."""
    if x.dim() == 2:
        cfg = CHOOSER.choose(x, weight, bias)
        if cfg is not None:
            return skinny_linear(x, weight, bias, config=cfg)
    return F.linear(x, weight, bias)


def add_norm_linear(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor,
                    eps: float, weight: torch.Tensor,
                    bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(linear(rms_norm(x + residual)), x + residual); residual None: x is the residual.
    One launch where CHOOSER measured that faster than the norm kernel and the product."""
    cfg = CHOOSER.choose(x, weight, bias, ADD_NORM, residual is not None)
    if cfg is not None:
        return skinny_add_norm_linear(x, residual, norm_weight, eps, weight, bias, config=cfg)
    return _add_norm_unfused(x, residual, norm_weight, eps, weight, bias)


def silu_linear(gate_up: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    """linear(silu(gate) * up), in one launch where CHOOSER measured that faster."""
    cfg = CHOOSER.choose(gate_up, weight, bias, SILU)
    if cfg is not None:
        return skinny_silu_linear(gate_up, weight, bias, config=cfg)
    return linear(silu_and_mul(gate_up), weight, bias)


def _add_norm_unfused(x, residual, norm_weight, eps, weight, bias):
    if residual is None:
        return linear(rms_norm(x, norm_weight, eps), weight, bias), x
    h, residual = fused_add_rms_norm(x, residual, norm_weight, eps)
    return linear(h, weight, bias), residual
