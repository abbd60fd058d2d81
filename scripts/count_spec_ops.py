"""Count the host work of one VERIFY step (EAGLE-3, greedy): per step, outside CUDA-graph
replays, (a) aten ops launched eagerly, (b) host syncs, (c) Triton call sites (kernels on
CUDA: models/ops.py, attention, sampler), (d) Python time by function (cProfile); also the
host-to-device copies (Stager moves). On CUDA it also prints wall ms per VERIFY step.

CPU (default): tiny llama target + tiny EAGLE-3 head (tests/checkpoints.py,
tests/eagle3_checkpoints.py); the graph paths run through a stand-in for ShapeGraphs that
copies inputs into static tensors per key (like the GPU) and runs the body eagerly, with
batches padded to the GPU's graph sizes, so the counts are those of the GPU path.
CUDA (--device cuda): the llama-3.1-8b preset with dummy weights and a dummy 8B-shaped head.

    python scripts/count_spec_ops.py [--device cuda] [--batch 1 32] [--configs chain tree]
        [--steps 8] [--profile-top 12] [--json out.json]

Data flow: LLM(eagle3, spec_policy=always) -> Engine.step (VERIFY) -> SpecWorker.verify_step,
counted by a TorchDispatchMode and patched sync / kernel call sites.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from gearshift.runner.graphs import copy_into  # noqa: E402

VIEW_OPS = {"view", "_unsafe_view", "slice", "select", "expand", "as_strided", "t", "transpose",
            "permute", "unsqueeze", "squeeze", "split", "split_with_sizes", "alias", "detach",
            "reshape", "unbind", "_reshape_alias", "lift_fresh", "narrow", "diagonal",
            "_local_scalar_dense", "unfold", "view_as", "to", "flatten", "contiguous",
            "expand_as", "type_as", "view_as_real"}  # no kernel of their own (a copy shows apart)
CONFIGS = {"chain": dict(num_draft_tokens=4),
           "tree": dict(num_draft_tokens=4, draft_topk=4, num_verify_tokens=16)}


class Probe(TorchDispatchMode):
    """aten ops and dispatch-level syncs outside graph bodies (inside > 0: a graph body)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter = Counter()
        self.syncs: Counter = Counter()
        self.triton: Counter = Counter()
        self.h2d = 0
        self.inside = 0
        self.graph_s = 0.0
        self.on = False
        self.prof: cProfile.Profile | None = None  # paused inside graph bodies
        self.profiling = False
        self.where: Counter = Counter()  # ops by the innermost gearshift function

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.on and not self.inside:
            name = func.overloadpacket.__name__
            self.ops[name] += 1
            if name not in VIEW_OPS:
                self.where[_caller()] += 1
            if name in ("nonzero", "masked_select") or (name == "repeat_interleave"
                                                         and "output_size" not in kwargs
                                                         and not isinstance(args[1], int)):
                self.syncs[f"aten.{name}"] += 1
            if name == "index" and any(i is not None and i.dtype == torch.bool for i in args[1]):
                self.syncs["aten.index(bool)"] += 1
        return func(*args, **kwargs)


def _caller() -> str:
    f = sys._getframe(2)
    while f is not None and "gearshift" not in f.f_code.co_filename:
        f = f.f_back
    if f is None:
        return "?"
    return f"{Path(f.f_code.co_filename).stem}.{f.f_code.co_name}:{f.f_lineno}"


def install_patches(probe: Probe) -> None:
    """Syncs (tensor -> host), Triton call sites and Stager copies, counted outside graphs."""
    from gearshift.attention import base
    from gearshift.models import ops
    from gearshift.runner import sampler
    from gearshift.scheduler import batch

    def count(counter, name, fn):
        def wrapped(*a, **k):
            if probe.on and not probe.inside:
                getattr(probe, counter)[name] += 1
            return fn(*a, **k)
        return wrapped

    for name in ("tolist", "item", "cpu", "numpy", "__bool__", "__int__", "__float__"):
        setattr(torch.Tensor, name, count("syncs", name, getattr(torch.Tensor, name)))
    for name in ("rms_norm", "add_rms_norm", "rope", "silu_and_mul"):
        setattr(ops, name, count("triton", name, getattr(ops, name)))
    base.AttentionBackend.attend = count("triton", "attention", base.AttentionBackend.attend)
    sampler.sample = count("triton", "sample", sampler.sample)
    move = batch.Stager.to_device

    def counted_move(self):  # one host-to-device copy per non-empty Stager
        if probe.on and not probe.inside and self.parts:
            probe.h2d += 1
        return move(self)
    batch.Stager.to_device = counted_move


class StandInGraphs:
    """ShapeGraphs without CUDA: static inputs per key (copied in on every replay, as on the
    GPU), the body re-run eagerly on them."""

    def __init__(self) -> None:
        self.static: dict = {}

    def run(self, key, fn, inputs):
        if key not in self.static:
            self.static[key] = {k: v.clone() for k, v in inputs.items()}
        static = self.static[key]
        copy_into([static[k] for k in inputs], list(inputs.values()))  # as ShapeGraphs does
        return fn(static)


def wrap_graphs(graphs, probe: Probe) -> None:
    run = graphs.run

    def counted_run(key, fn, inputs):
        def body(s):
            probe.inside += 1
            profiling = probe.profiling
            if profiling:
                probe.prof.disable()
            t0 = time.perf_counter()
            try:
                return fn(s)
            finally:
                probe.inside -= 1
                probe.graph_s += time.perf_counter() - t0
                if profiling:
                    probe.prof.enable()
        return run(key, body, inputs)
    graphs.run = counted_run


def build_llm(args, spec: dict, batch: int, tmp: Path):
    from gearshift import LLM
    from gearshift.runner.graphs import default_batch_sizes, pick_bucket

    common = dict(speculative_algorithm="eagle3", spec_policy="always",
                  max_num_seqs=max(batch, 8), **spec)
    if args.device == "cuda":
        from gearshift.bench.spec_costs import write_dummy_head
        from gearshift.models.loader import PRESETS_DIR

        cfg = json.loads((PRESETS_DIR / f"{args.preset}.json").read_text())
        head = write_dummy_head(cfg, tmp / "head", 32000, "cuda")
        return LLM(args.preset, load_format="dummy", draft_model=str(head), **common)
    from checkpoints import make_tiny_checkpoint
    from eagle3_checkpoints import make_eagle3_checkpoint

    target = make_tiny_checkpoint(tmp / "target", "llama")
    head = make_eagle3_checkpoint(tmp / "head", aux_layer_ids=[0, 1, 1])
    llm = LLM(model=str(target), device="cpu", dtype="float32", attention_backend="torch",
              kv_cache_tokens=8192, max_num_batched_tokens=2048, draft_model=str(head), **common)
    runner = llm.engine.runner
    runner.shape_graphs = StandInGraphs()
    sizes = default_batch_sizes(max(batch, 8))  # the GPU's decode graph sizes
    runner.decode_pad = lambda bs: pick_bucket(sizes, bs) or bs
    return llm


def measure(args, name: str, batch: int, probe: Probe) -> dict:
    from gearshift import SamplingParams

    with tempfile.TemporaryDirectory() as tmp:
        llm = build_llm(args, CONFIGS[name], batch, Path(tmp))
        eng = llm.engine
        wrap_graphs(eng.runner.shape_graphs, probe)
        g = torch.Generator().manual_seed(0)
        vocab = eng.runner.model.config.vocab_size
        for i in range(batch):
            prompt = torch.randint(3, vocab, (args.prompt_len,), generator=g).tolist()
            eng.add_request(str(i), prompt, SamplingParams(
                max_tokens=4 * args.steps * 6 + 64, temperature=0.0, ignore_eos=True))
        full = {"n": 0}
        verify_step = eng.spec.verify_step

        def spied(plan, scheduler):
            full["n"] = len(plan.reqs) if max(plan.draft_lens) == 4 else 0
            return verify_step(plan, scheduler)
        eng.spec.verify_step = spied
        sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
        walls, hosts, steps, counted = [], [], 0, 0
        prof = probe.prof = cProfile.Profile()
        warm = args.warmup
        while steps < args.steps and eng.has_unfinished_requests():
            timed = warm <= 0
            counting = timed and not args.wall_only and counted <= steps
            sync()
            full["n"], g0 = 0, probe.graph_s
            before = (Counter(probe.ops), Counter(probe.syncs), Counter(probe.triton), probe.h2d,
                      Counter(probe.where))
            probe.on = counting
            t0 = time.perf_counter()
            if counting:
                with probe:
                    eng.step()
            elif timed and not args.wall_only:
                probe.profiling = True
                prof.enable()
                eng.step()
                prof.disable()
                probe.profiling = False
            else:
                eng.step()
            probe.on = False
            sync()
            dt = time.perf_counter() - t0
            if full["n"] != batch:  # prefill, or a step with fewer requests / smaller K
                probe.ops, probe.syncs, probe.triton, probe.h2d, probe.where = before
                continue
            warm -= 1
            if counting:
                counted += 1
            elif timed:
                steps += 1
                walls.append(dt * 1e3)
                hosts.append((dt - (probe.graph_s - g0)) * 1e3)
        llm.shutdown() if hasattr(llm, "shutdown") else None
    n, c = max(steps, 1), max(counted, 1)
    try:
        stats = pstats.Stats(prof).stats
    except TypeError:  # --wall-only: nothing was profiled
        stats = {}
    rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[: args.profile_top]
    kernels = {k: v for k, v in probe.ops.items() if k not in VIEW_OPS}
    return {
        "config": name, "batch": batch, "steps": steps,
        "aten_ops": sum(probe.ops.values()) / c,
        "aten_kernel_ops": sum(kernels.values()) / c,
        "syncs": sum(probe.syncs.values()) / c, "sync_kinds": dict(probe.syncs),
        "triton_sites": sum(probe.triton.values()) / c, "triton_kinds": dict(probe.triton),
        "h2d_copies": probe.h2d / c,
        "wall_ms": sorted(walls)[len(walls) // 2] if walls else None,
        "host_ms_outside_graphs": sorted(hosts)[len(hosts) // 2] if hosts else None,
        "where": Counter({k: v / c for k, v in probe.where.items()}).most_common(args.where),
        "top_ops": Counter({k: v / c for k, v in kernels.items()}).most_common(15),
        "profile": [(f"{Path(f).name}:{ln}({fn})", round(tt / n * 1e3, 3), round(ct / n * 1e3, 3))
                    for (f, ln, fn), (_, _, tt, ct, _) in rows],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--preset", default="llama-3.1-8b")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    p.add_argument("--configs", nargs="+", default=["chain", "tree"], choices=list(CONFIGS))
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--prompt-len", type=int, default=40)
    p.add_argument("--profile-top", type=int, default=12)
    p.add_argument("--where", type=int, default=0, help="list the top N op call sites")
    p.add_argument("--wall-only", action="store_true", help="no counting (clean wall times)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
        torch.set_num_threads(1)
    probe = Probe()
    install_patches(probe)
    results = []
    with torch.inference_mode():
        for name in args.configs:
            for b in args.batch:
                probe.ops, probe.syncs, probe.triton = Counter(), Counter(), Counter()
                probe.h2d, probe.where = 0, Counter()
                r = measure(args, name, b, probe)
                results.append(r)
                print(f"\n== {name} K=4 batch {b} ({args.device}, {r['steps']} VERIFY steps) ==")
                print(f"(a) eager aten ops/step: {r['aten_ops']:.1f} "
                      f"(kernel-launching, views excluded: {r['aten_kernel_ops']:.1f})")
                print(f"(b) host syncs/step: {r['syncs']:.2f} {r['sync_kinds']}")
                print(f"(c) Triton call sites outside graphs/step: {r['triton_sites']:.2f} "
                      f"{r['triton_kinds']}")
                print(f"    H2D copies (Stager moves)/step: {r['h2d_copies']:.2f}")
                print(f"    wall ms/step: {r['wall_ms']:.2f}, host ms outside graph bodies: "
                      f"{r['host_ms_outside_graphs']:.2f}")
                print("    top eager ops/step:", ", ".join(f"{k} {v:.1f}" for k, v in r["top_ops"]))
                if args.where:
                    print("    eager kernel ops by call site/step:")
                    for site, v in r["where"]:
                        print(f"    {v:6.1f}  {site}")
                print("(d) cProfile per step (tottime ms, cumtime ms):")
                for fn, tt, ct in r["profile"]:
                    print(f"    {tt:8.3f} {ct:8.3f}  {fn}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
