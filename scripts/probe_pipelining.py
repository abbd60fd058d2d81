"""Which loops of the attention kernels Triton software-pipelines on this GPU: compiles the
extend kernel (the bench's 60 decoders + a 452-token chunk, the engine's config) and the
decode kernel (batch 64, one split), then counts per kernel the scf.for loops and the
asynchronous copies (cp.async / TMA) in the TTGIR and the PTX.

Why (session 19): the extend kernel's decoder path read 60 decoders' K/V at 2.9 TB/s
(52.2 us a layer) where the decode kernel reads batch 64 at 4.0 TB/s, and 64-key blocks
made the decoder path slower (59.6 us), not faster as in the decode kernel: the signature
of loads that are not pipelined.

Reading it (session 20): a count of asynchronous copies does not mean overlap. In both
kernels each gathered K/V block goes to one shared buffer, is issued after the previous
block's dots and is waited for (`async_wait {num = 0}`) at the top of the next iteration;
look at the buffers' leading dimension and the waits' `num` in the TTGIR it writes.

Usage: python scripts/probe_pipelining.py --out DIR
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import torch


def compiled(fn):
    """Every compiled variant of a @triton.jit function (Triton 3.x caches)."""
    out = []
    for caches in getattr(fn, "device_caches", {}).values():
        cache = caches[0] if isinstance(caches, tuple) else caches
        out += list(cache.values())
    return out


def summary(name: str, kernel, out: Path) -> None:
    asm = kernel.asm
    (out / f"{name}.ttgir").write_text(asm.get("ttgir", ""))
    (out / f"{name}.ptx").write_text(asm.get("ptx", ""))
    ttgir, ptx = asm.get("ttgir", ""), asm.get("ptx", "")
    counts = {
        "scf.for": ttgir.count("scf.for"),
        "async_copy_global_to_local": ttgir.count("async_copy_global_to_local"),
        "async_wait": ttgir.count("async_wait"),
        "tma loads": len(re.findall(r"async_tma_copy|descriptor_load", ttgir)),
        "ptx cp.async": ptx.count("cp.async."),
        "ptx ld.global": ptx.count("ld.global"),
        "shared bytes": kernel.metadata.shared if hasattr(kernel, "metadata") else None,
        "num_warps": getattr(kernel.metadata, "num_warps", None),
    }
    print(name, counts, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="probe")
    out = Path(ap.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "bench_extend_attn", Path(__file__).with_name("bench_extend_attn.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    from gearshift.kernels import decode, extend

    g = torch.Generator(device="cuda").manual_seed(0)
    b = bench.batch(bench.CASES["mixed512_graph"], g)
    bench.run(b, torch.empty_like(b["q"]), None)
    for i, k in enumerate(compiled(extend._extend_kernel)):
        summary(f"extend_{i}", k, out)
    bs, ctx = 64, 640
    q = torch.randn(bs, 32, 128, device="cuda", dtype=torch.bfloat16)
    slots = bs * ctx + 1
    kc = torch.randn(slots, 8, 128, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    rtt = torch.arange(1, slots, device="cuda", dtype=torch.int32).view(bs, ctx)
    rtt = torch.cat([torch.zeros(1, ctx, dtype=torch.int32, device="cuda"), rtt])
    idx = torch.arange(1, bs + 1, device="cuda")
    seq = torch.full((bs,), ctx, device="cuda", dtype=torch.int32)
    o = torch.empty_like(q)
    decode.decode_attention(q, kc, vc, rtt, idx, seq, 128**-0.5, o, num_kv_splits=1,
                            blocks=decode.decode_blocks(bs, 8, 1))
    for i, k in enumerate(compiled(decode._decode_split_kernel)):
        summary(f"decode_{i}", k, out)


if __name__ == "__main__":
    main()
