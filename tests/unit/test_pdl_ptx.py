"""The PDL rules of kernels/pdl.py, checked in the code Triton generates for an H200
(sm90, compiled on the CPU): a kernel launched with programmatic dependent launch reads and
writes nothing before `griddepcontrol.wait` (the kernel before it may still run), except the
skinny GEMM's L2 prefetch of its weight rows, and lets the next kernel launch
(`griddepcontrol.launch_dependents`). Without PDL the kernels contain neither. Compiling
the TMA GEMM here also catches an sm90 compile error that the CPU's interpreter runs would
not.

The GPU tests run the engine with PDL on; this one fails if a kernel touches memory before
its wait, which a GPU run would show only as a rare race. It compiles in a subprocess:
tests/kernels sets TRITON_INTERPRET, under which nothing compiles.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

_SCRIPT = r"""
import json, re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from gearshift.kernels import decode
from gearshift.kernels import activation, norm, rope, skinny_gemm

DECODE_PTRS = {"ReqToToken": "*i32", "ReqPoolIdx": "*i64", "SeqLens": "*i32", "Work": "*fp32",
               "Positions": "*i64", "Cos": "*fp32", "Sin": "*fp32", "OutCacheLoc": "*i64"}
TMA_PTRS = {"x_desc": "tensordesc<bf16[64, 128]>", "w_desc": "tensordesc<bf16[64, 128]>"}
KERNELS = {  # name -> (jit function, pointer types, constexprs)
    "skinny_tma": (skinny_gemm._skinny_tma_kernel, TMA_PTRS, dict(
        HAS_BIAS=False, GATED=True, BLOCK_M=64, BLOCK_N=64, BLOCK_K=128, NUM_STAGES=4, RMS=True,
        ACCUMULATE=False, PREFETCH=256, LINE=64)),
    "skinny_gated": (skinny_gemm._skinny_gemm_kernel, {}, dict(
        HAS_BIAS=False, EVEN_K=True, GATED=True, BLOCK_M=16, BLOCK_N=32, BLOCK_K=256,
        ACCUMULATE=True, PREFETCH=512, LINE=64)),
    "rms_norm": (norm._rms_norm_kernel, {}, dict(HAS_RESIDUAL=True, BLOCK_M=1, BLOCK_N=4096)),
    "silu_and_mul": (activation._silu_and_mul_kernel, {}, dict(BLOCK=1024, ACCURATE_EXP=False)),
    "rope_store": (rope._rope_kernel, {"Positions": "*i64", "Cos": "*fp32", "Sin": "*fp32",
                                       "OutCacheLoc": "*i64"},
                   dict(HALF=64, BLOCK_H=8, BLOCK_D=64, STORE_KV=True)),
    "decode_split": (decode._decode_split_kernel, DECODE_PTRS,
                     dict(GROUP=4, HEAD_DIM=128, NUM_SPLITS=2, BLOCK_H=16, BLOCK_D=128,
                          BLOCK_N=64, DOT_PRECISION="tf32", ROPE=False)),
    "decode_rope": (decode._decode_split_kernel, DECODE_PTRS,
                    dict(GROUP=4, HEAD_DIM=128, NUM_SPLITS=1, BLOCK_H=16, BLOCK_D=128,
                         BLOCK_N=64, DOT_PRECISION="tf32", ROPE=True)),
}
FLOATS = {"eps", "inv_num_cols", "sm_scale_log2"}
GEMM = skinny_gemm._skinny_gemm_kernel  # its M, N, K are sizes (decode's K is the cache)
SIZED_K = (GEMM, skinny_gemm._skinny_tma_kernel)
pdl = sys.argv[1] == "on"
report = {}
for name, (fn, ptr_types, consts) in KERNELS.items():
    consts = dict(consts, PDL=pdl)
    sig, constexprs = {}, {}
    for i, p in enumerate(fn.params):
        if p.is_constexpr:
            sig[p.name] = "constexpr"
            constexprs[(i,)] = consts[p.name]
        elif p.name in FLOATS:
            sig[p.name] = "fp32"
        elif p.name in ptr_types:
            sig[p.name] = ptr_types[p.name]
        elif p.name[0].isupper() and p.name not in ("M", "N") and not (p.name == "K" and fn in SIZED_K):
            sig[p.name] = "*bf16"
        else:
            sig[p.name] = "i32"
    src = ASTSource(fn=fn, signature=sig, constexprs=constexprs)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                         options={"num_warps": 4, "num_stages": 2, "launch_pdl": pdl}).asm["ptx"]
    lines = [ln.strip() for ln in ptx.splitlines()]
    def first(pattern):
        return next((i for i, ln in enumerate(lines) if re.match(pattern, ln)), None)
    report[name] = {
        "wait": first(r"griddepcontrol\.wait"),
        "trigger": first(r"griddepcontrol\.launch_dependents"),
        "memory": first(r"(@%p\d+ )?(ld\.global|st\.global|cp\.async|atom\.|red\.|ld\.shared)"),
        "prefetch": first(r"prefetch\.global\.L2"),
    }
print(json.dumps(report))
"""


def _compile(mode: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["GEARSHIFT_PDL"] = mode
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, mode], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_pdl_kernels_wait_before_touching_memory():
    report = _compile("on")
    for name, at in report.items():
        assert at["wait"] is not None and at["trigger"] is not None, name
        assert at["memory"] is not None and at["wait"] < at["memory"], (name, at)
        assert at["wait"] < at["trigger"], (name, at)  # one kernel launched ahead at most
    for gemm in (report["skinny_gated"], report["skinny_tma"]):
        assert gemm["prefetch"] is not None and gemm["prefetch"] < gemm["wait"]
        assert gemm["trigger"] > gemm["memory"]  # after the K loop's loads, not at the top


def test_without_pdl_no_grid_dependency_ops():
    for name, at in _compile("off").items():
        assert at["wait"] is None and at["trigger"] is None and at["prefetch"] is None, name


def test_pdl_is_off_off_the_gpu():
    from gearshift.kernels import pdl

    assert not pdl.enabled("cpu") and pdl.launch_kwargs("cpu") == {}
