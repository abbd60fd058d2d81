"""Throughput and energy of the 512-row layer GEMMs under sustained load (the power cap):
cuBLAS's pick and every cuBLASLt heuristic candidate, each back-to-back in a CUDA graph
for ~1 s; NVML energy counter and SM clock. Session 20."""
import ctypes, json, sys, time
import torch
sys.path.insert(0, ".cache/lt")
from cublaslt import LtGemm

nv = ctypes.CDLL("libnvidia-ml.so.1")
nv.nvmlInit_v2()
h = ctypes.c_void_p()
nv.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h))
def energy_mj():
    e = ctypes.c_ulonglong(); nv.nvmlDeviceGetTotalEnergyConsumption(h, ctypes.byref(e)); return e.value
def sm_clock():
    c = ctypes.c_uint(); nv.nvmlDeviceGetClockInfo(h, 1, ctypes.byref(c)); return c.value

SHAPES = {"qkv": (6144, 4096, False), "o_proj": (4096, 4096, True),
          "gate_up": (28672, 4096, False), "down": (4096, 14336, True)}
M = int(sys.argv[1]) if len(sys.argv) > 1 else 512

def sustained(fn, calls=40, warm_s=0.4, run_s=0.8):
    g = torch.cuda.CUDAGraph()
    fn(); torch.cuda.synchronize()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    t = time.time()
    while time.time() - t < warm_s:
        g.replay(); torch.cuda.synchronize()
    reps, clocks = 0, []
    e0, t0 = energy_mj(), time.perf_counter()
    while time.perf_counter() - t0 < run_s:
        g.replay(); reps += 1
        if reps % 4 == 0:
            torch.cuda.synchronize(); clocks.append(sm_clock())
    torch.cuda.synchronize()
    dt, de = time.perf_counter() - t0, energy_mj() - e0
    n = reps * calls
    return {"us": dt / n * 1e6, "mj": de / n, "watts": de / dt / 1e3,
            "sm_mhz": sorted(clocks)[len(clocks) // 2] if clocks else None}

out = []
g = torch.Generator(device="cuda").manual_seed(0)
for name, (n, k, acc) in SHAPES.items():
    x = (torch.randn(M, k, device="cuda", generator=g) * 0.1).bfloat16()
    w = (torch.randn(n, k, device="cuda", generator=g) * 0.02).bfloat16()
    o = torch.zeros(M, n, device="cuda").bfloat16()
    rows = []
    ref = (lambda: o.addmm_(x, w.t())) if acc else (lambda: torch.mm(x, w.t(), out=o))
    r = sustained(ref); r["algo"] = "cublas"; rows.append(r)
    gemm = LtGemm(M, n, k, torch.bfloat16, accumulate=acc)
    for i, a in enumerate(gemm.candidates(16)):
        try:
            r = sustained(lambda a=a: gemm.run(a, x, w, o)); r["algo"] = f"#{i} " + a.describe()
        except RuntimeError as e:
            r = {"algo": f"#{i}", "error": str(e)}
        rows.append(r)
    for r in rows:
        if "us" in r:
            print(f"m={M} {name:8s} {r['us']:7.1f} us {r['mj']:6.3f} mJ {r['watts']:5.0f} W {r['sm_mhz']} MHz  {r['algo']}", flush=True)
    out.append({"name": name, "m": M, "rows": rows})
json.dump(out, open(sys.argv[2] if len(sys.argv) > 2 else "sustained.json", "w"), indent=1)
