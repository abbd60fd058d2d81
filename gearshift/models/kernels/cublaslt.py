"""cuBLASLt with an explicit algorithm: x @ W.T (+ C) through the cuBLASLt library torch
already loaded, by ctypes.

torch's `F.linear` / `addmm_` run cuBLAS's (or cuBLASLt's) first heuristic pick for a
shape. cuBLASLt's heuristic can list more (other tiles, stages, cluster shapes, split-K);
`LtGemm.candidates()` returns them and `LtGemm.run(algo, ...)` runs one, so a chooser can
time them and keep the fastest for a fixed shape (as TensorRT-LLM's GEMM profiler does).

Layout: row-major x [M, K], W [N, K], out [M, N] are column-major x^T [K, M], W^T [K, N],
out^T [N, M]; out^T = op_T(W^T) @ x^T with m = N, n = M, k = K. `accumulate`: out += the
product (beta = 1, C = D = out: the residual add of o_proj / down).

Every call is stream-ordered on torch's current stream and allocates nothing (the
workspace is a torch tensor made once), so it can be captured in a CUDA graph.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

import torch

_COMPUTE_32F = 68  # cublasComputeType_t CUBLAS_COMPUTE_32F
_R_32F, _R_16F, _R_16BF = 0, 2, 14  # cudaDataType_t
_DESC_TRANSA, _DESC_TRANSB = 3, 4  # cublasLtMatmulDescAttributes_t
_PREF_MAX_WORKSPACE_BYTES = 1  # cublasLtMatmulPreferenceAttributes_t
_OP_N, _OP_T = 0, 1
# cublasLtMatmulAlgoConfigAttributes_t: what the report names of each algorithm
_ALGO_ATTRS = {"id": 0, "tile": 1, "split_k": 2, "reduction": 3, "swizzle": 4, "custom": 5,
               "stages": 6, "inner": 7, "cluster": 8}
WORKSPACE_BYTES = 32 << 20


class _Algo(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64 * 8)]


class _Heuristic(ctypes.Structure):
    _fields_ = [("algo", _Algo), ("workspace_size", ctypes.c_size_t), ("state", ctypes.c_int),
                ("waves_count", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


@functools.cache
def _lib() -> ctypes.CDLL:
    """The libcublasLt torch loaded (found in this process's mappings after a matmul)."""
    a = torch.ones(16, 16, device="cuda", dtype=torch.bfloat16)
    torch.backends.cuda.preferred_blas_library("cublaslt")
    try:
        (a @ a).sum().item()
    finally:
        torch.backends.cuda.preferred_blas_library("default")
    with open("/proc/self/maps") as f:
        paths = {line.split()[-1] for line in f if "libcublasLt" in line}
    if not paths:
        raise RuntimeError("libcublasLt is not loaded in this process")
    return ctypes.CDLL(sorted(paths)[0])


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"cuBLASLt {what} failed with status {status}")


@functools.cache
def _handle() -> ctypes.c_void_p:
    h = ctypes.c_void_p()
    _check(_lib().cublasLtCreate(ctypes.byref(h)), "cublasLtCreate")
    return h


@functools.cache
def _workspace(device_index: int) -> torch.Tensor:
    return torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=f"cuda:{device_index}")


def _algo_attr(algo: _Algo, attr: int) -> int | None:
    """One config attribute of an algorithm (its storage is 2 or 4 bytes: asked first)."""
    lib, size = _lib(), ctypes.c_size_t(0)
    if lib.cublasLtMatmulAlgoConfigGetAttribute(ctypes.byref(algo), attr, None, ctypes.c_size_t(0),
                                                ctypes.byref(size)) != 0 or size.value > 8:
        return None
    buf = ctypes.c_uint64(0)
    if lib.cublasLtMatmulAlgoConfigGetAttribute(ctypes.byref(algo), attr, ctypes.byref(buf), size,
                                                ctypes.byref(size)) != 0:
        return None
    return buf.value


_DTYPES = {torch.bfloat16: _R_16BF, torch.float16: _R_16F, torch.float32: _R_32F}


@dataclass(frozen=True)
class LtAlgo:
    """One cuBLASLt algorithm for one LtGemm shape: its opaque bytes and what they say."""
    raw: bytes
    workspace: int
    waves: float
    info: tuple[tuple[str, int], ...]

    def describe(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.info) + f" waves={self.waves:.2f}"


class LtGemm:
    """out[M, N] (+)= x[M, K] @ W[N, K].T for one (M, N, K, dtype, accumulate)."""

    def __init__(self, m: int, n: int, k: int, dtype: torch.dtype, accumulate: bool = False):
        if dtype not in _DTYPES:
            raise ValueError(f"cuBLASLt path takes bf16 / fp16 / fp32, not {dtype}")
        lib, t = _lib(), _DTYPES[dtype]
        self.m, self.n, self.k, self.dtype, self.accumulate = m, n, k, dtype, accumulate
        self._desc = ctypes.c_void_p()
        scale = _R_32F
        _check(lib.cublasLtMatmulDescCreate(ctypes.byref(self._desc), _COMPUTE_32F, scale),
               "MatmulDescCreate")
        for attr, op in ((_DESC_TRANSA, _OP_T), (_DESC_TRANSB, _OP_N)):
            v = ctypes.c_int32(op)
            _check(lib.cublasLtMatmulDescSetAttribute(self._desc, attr, ctypes.byref(v),
                                                      ctypes.c_size_t(4)),
                   "MatmulDescSetAttribute")
        self._a, self._b, self._c = (ctypes.c_void_p() for _ in range(3))
        for lay, rows, cols in ((self._a, k, n), (self._b, k, m), (self._c, n, m)):
            _check(lib.cublasLtMatrixLayoutCreate(ctypes.byref(lay), t, ctypes.c_uint64(rows),
                                                  ctypes.c_uint64(cols), ctypes.c_int64(rows)),
                   "MatrixLayoutCreate")
        self._alpha = ctypes.c_float(1.0)
        self._beta = ctypes.c_float(1.0 if accumulate else 0.0)

    def candidates(self, count: int = 32) -> list[LtAlgo]:
        """Up to `count` algorithms cuBLASLt's heuristic offers for this shape, best first."""
        lib = _lib()
        pref = ctypes.c_void_p()
        _check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "PreferenceCreate")
        ws = ctypes.c_uint64(WORKSPACE_BYTES)
        _check(lib.cublasLtMatmulPreferenceSetAttribute(pref, _PREF_MAX_WORKSPACE_BYTES,
                                                        ctypes.byref(ws), ctypes.c_size_t(8)),
               "PreferenceSet")
        results = (_Heuristic * count)()
        found = ctypes.c_int(0)
        status = lib.cublasLtMatmulAlgoGetHeuristic(
            _handle(), self._desc, self._a, self._b, self._c, self._c, pref, count, results,
            ctypes.byref(found))
        lib.cublasLtMatmulPreferenceDestroy(pref)
        _check(status, "AlgoGetHeuristic")
        algos = []
        for r in results[:found.value]:
            if r.state != 0:
                continue
            info = tuple((name, v) for name, v in ((n, _algo_attr(r.algo, a))
                                                   for n, a in _ALGO_ATTRS.items()) if v is not None)
            algos.append(LtAlgo(bytes(r.algo), r.workspace_size, r.waves_count, info))
        return algos

    def run(self, algo: LtAlgo, x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor) -> None:
        """out = x @ weight.T (accumulate: out += ...) with `algo`, on the current stream."""
        assert x.shape == (self.m, self.k) and weight.shape == (self.n, self.k)
        assert out.shape == (self.m, self.n) and x.is_contiguous() and weight.is_contiguous()
        assert out.is_contiguous() and x.dtype == weight.dtype == out.dtype == self.dtype
        a = _Algo.from_buffer_copy(algo.raw)
        ws = _workspace(x.device.index or 0)
        stream = ctypes.c_void_p(torch.cuda.current_stream(x.device).cuda_stream)
        _check(_lib().cublasLtMatmul(
            _handle(), self._desc, ctypes.byref(self._alpha), ctypes.c_void_p(weight.data_ptr()),
            self._a, ctypes.c_void_p(x.data_ptr()), self._b, ctypes.byref(self._beta),
            ctypes.c_void_p(out.data_ptr()), self._c, ctypes.c_void_p(out.data_ptr()), self._c,
            ctypes.byref(a), ctypes.c_void_p(ws.data_ptr()), ctypes.c_size_t(WORKSPACE_BYTES),
            stream), "Matmul")
