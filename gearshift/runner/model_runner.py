"""ModelRunner: owns the model, the KV cache, the attention backend and the CUDA graphs
(DECODE per padded batch size, EXTEND per padded token count, VERIFY shapes); chooses
each plan's device shape (`layout`, runner/layout.py) and runs a prepared batch through
its one entry, `forward`, without synchronising the host.

Data flow: Engine.step(): ModelRunner.layout(plan) -> BatchBuilder.prepare(plan) ->
ModelRunner.forward(batch) -> token ids (device; VERIFY: the pass's logits, for
verification) -> Engine reads them once (the step's single sync) -> Scheduler.commit.
"""

from __future__ import annotations

import logging
import time
from collections import Counter

import torch

from gearshift.attention.base import KVCache, create_backend
from gearshift.config import EngineConfig, ModelConfig
from gearshift.forward_batch import ForwardBatch, ForwardMode
from gearshift.models.loader import DTYPES, load_model
from gearshift.models.parallel import TensorParallel
from gearshift.progress import progress
from gearshift.runner.graphs import (
    GraphCache,
    decode_capture_batch,
    deep_levels,
    default_batch_sizes,
    extend_capture_batch,
    extend_token_buckets,
    fastest_at_or_above,
    mixed_verify_tokens,
    pick_bucket,
    verify_rows,
)
from gearshift.runner.layout import SPLIT_K_BELOW, plain_layout, verify_layout
from gearshift.runner.logprobs import LogprobPlan, prompt_logprobs, token_logprobs
from gearshift.runner.memory_plan import provisional_slots
from gearshift.runner.penalties import TokenCounts
from gearshift.runner.sampler import SamplingBatch, sample
from gearshift.runner.startup_checks import check_device, context_limit, set_cpu_threads
from gearshift.scheduler.plan import Layout, StepPlan

log = logging.getLogger("gearshift.runner")


class ModelRunner:
    def __init__(self, config: EngineConfig, model_cfg: ModelConfig, model_path,
                 tp: TensorParallel | None = None) -> None:
        self.config = config
        self.tp = tp  # this rank's part of a tensor-parallel model (None: the whole model)
        check_device(config)  # one clear line before anything loads
        self.device = torch.device(config.device)
        if self.device.type == "cpu":
            set_cpu_threads(config)
        if self.device.type == "cuda":
            if self.device.index is None:
                self.device = torch.device("cuda", torch.cuda.current_device())
            torch.cuda.set_device(self.device)
        dtype = DTYPES[config.dtype]
        t0 = time.perf_counter()
        # positions beyond the KV capacity can never be used; size RoPE for the model's limit
        max_pos = context_limit(config, model_cfg)
        self.max_positions = max_pos
        self.model = load_model(model_cfg, model_path, dtype=config.dtype, device=config.device,
                                max_positions=max_pos, seed=config.seed, tp=tp)
        size = sum(p.numel() * p.element_size() for p in self.model.parameters())
        log.info("loaded %s weights (%.2f GiB) in %.1f s", "dummy" if model_path is None
                 else "the", size / 2**30, time.perf_counter() - t0)
        if config.fuse_norms and self.device.type == "cuda" and dtype != torch.float32:
            from gearshift.kernels.skinny_select import tma_capable

            if tma_capable(self.device):
                self.model.fold_norms()  # norms and residual adds inside small steps' GEMMs
        self.weights_bytes = size
        # on a GPU without kv_cache_tokens the cache starts small, for the start-up memory
        # profile of the largest steps (engine/memory_profile.py), which then sizes it
        self.kv_provisional = self._profiles_memory()
        self.num_slots = self._kv_capacity()
        self.max_model_len = min(max_pos, self.num_slots)
        # req_to_token as wide as the final cache may make the context (a provisional
        # cache's length would cut it)
        width = max_pos if self.kv_provisional else self.max_model_len
        self.kv = KVCache.allocate(model_cfg.num_layers, self.num_slots, self.model.num_kv_heads,
                                   model_cfg.head_dim, config.max_num_seqs, width,
                                   dtype, self.device)
        self.attn = create_backend(config.attention_backend, self.kv, model_cfg.head_dim ** -0.5)
        # CUDA events around the latest forward(): a fresh pair per call, so a
        # step still in flight (overlap scheduling) keeps its own pair
        self.last_events: tuple[torch.cuda.Event, torch.cuda.Event] | None = None
        # the CUDA graphs of every shape (runner/graphs.py): plain steps' captured at start-up
        self.shape_graphs: GraphCache | None = None
        self.decode_sizes: list[int] = []  # padded batch sizes of the ("decode", bs) graphs
        self.extend_sizes: list[int] = []  # padded token counts of EXTEND steps (graph buckets)
        self.extend_route: dict[int, int] = {}  # bucket -> the graph its steps run in
        self.extend_rows = config.max_num_seqs + 1  # per-request rows of a padded EXTEND batch
        self.capture: tuple[int, ...] = ()  # target layers whose outputs the draft consumes
        # (draft depth, tree width) -> nodes per request of a VERIFY step's draft tree
        # (set by SpecRunner: its proposer's expansion)
        self.draft_nodes = lambda depth, topk: depth + 1
        self.split_k_below = SPLIT_K_BELOW  # runner/layout.py split_k
        # a hybrid's suffix chains deeper than the model's K verify at a few depths past it
        # and token buckets (runner/graphs.py deep_levels, verify_rows): graphs for those
        k, deepest = config.num_draft_tokens, config.suffix_draft_tokens if config.hybrid else 0
        self.deep_depths = deep_levels(k, deepest)
        self.verify_per_row = verify_rows(k, deepest) if self.deep_depths else ()
        self.step_counts: Counter[str] = Counter()  # {decode,extend,verify}_{graphed,eager} calls
        self.dtype = dtype
        self._outputs: dict[str, torch.Tensor] = {}  # shared outputs of VERIFY-shape graphs
        self._retired_outputs: list[torch.Tensor] = []  # kept alive for graphs that wrote them
        self._counts: TokenCounts | None = None  # penalties' token counts, made on first use
        self.memory_plan = None  # the start-up memory profile's KvPlan (GPU, no kv_cache_tokens)

    def prepare_hot_path(self, capture: tuple[int, ...] = ()) -> None:
        """Compile kernels and capture the EXTEND and DECODE CUDA graphs (with `capture`
        outputs when a draft consumes target features), largest first, into the graph
        cache. Called once the engine knows its draft."""
        self.capture = capture
        if self.device.type == "cuda":
            from gearshift.kernels.sample import warmup as warmup_sampler

            warmup_sampler(self.model.config.vocab_size, self.device, (self.dtype, torch.float32))
            if self.config.attention_backend == "triton":
                from gearshift.kernels.extend import warmup_extend

                warmup_extend(self.kv.k[0], self.kv.v[0], self.kv.req_to_token,
                              self.model.num_heads)
        if not (self.config.use_cuda_graphs and self.config.attention_backend == "triton"):
            return
        t0 = time.perf_counter()
        cfg = self.model.config
        self.attn.reserve_decode_workspace(self.config.max_num_seqs, self.model.num_heads,
                                           cfg.head_dim)
        sizes = extend_token_buckets(self._extend_graph_limit())
        self.shape_graphs = GraphCache()
        self.capture_plain_graphs(sizes, default_batch_sizes(self.config.max_num_seqs))
        if sizes:
            times = {t: self.plain_graph_ms(("extend", t)) for t in sizes}
            if self.tp is not None:  # every rank pads a step alike: rank 0's timings decide
                times = self.tp.comm.broadcast_object(times)
            self.extend_route = fastest_at_or_above(times)
            log.debug("extend graph replay ms %s; padded further: %s",
                      {s: round(ms, 2) for s, ms in times.items()},
                      {s: r for s, r in self.extend_route.items() if r != s} or "none")
        log.info("captured %d decode graphs and %d extend graphs (tokens %s, %d rows) in %.1fs",
                 len(self.decode_sizes), len(sizes), sizes, self.extend_rows,
                 time.perf_counter() - t0)

    def capture_plain_graphs(self, extend_sizes: list[int], decode_sizes: list[int]) -> None:
        """Capture the ("extend", tokens) and ("decode", bs) graphs into the graph cache:
        EXTEND first (the widest activations: later graphs reuse their memory), each kind
        largest first, every one on its capture layout."""
        keys = [("extend", t) for t in sorted(extend_sizes, reverse=True)] + \
            [("decode", b) for b in sorted(decode_sizes, reverse=True)]
        for key in progress(keys, desc="capturing CUDA graphs", unit="graph"):
            fb = self._capture_batch(key)
            self.shape_graphs.capture(key, self._plain_body(fb), graph_inputs(fb), owned=False)
        self.extend_sizes, self.decode_sizes = sorted(extend_sizes), sorted(decode_sizes)

    def plain_graph_ms(self, key: tuple) -> float:
        """Device ms of one replay of a plain step's graph on its capture layout."""
        return self.shape_graphs.time_ms(key, graph_inputs(self._capture_batch(key)))

    def _capture_batch(self, key: tuple) -> ForwardBatch:
        if key[0] == "decode":
            return decode_capture_batch(key[1], self.device)
        return extend_capture_batch(key[1], self.extend_rows, self.device)

    def _plain_body(self, fb: ForwardBatch):
        """A plain step's graph body over static inputs (fb's host fields: shape constants)."""
        return lambda static: self._forward_logits(rebuild_batch(fb, static))

    def chain_depth(self, depth: int) -> int:
        """The depth a step whose deepest chain has `depth` drafts verifies at: itself up to
        the model's K, past it the next of deep_depths (its extra nodes never accepted)."""
        if depth <= self.config.num_draft_tokens:
            return depth
        return next((d for d in self.deep_depths if d >= depth), depth)

    def verify_bucket(self, rows: int, tokens: int) -> int:
        """Token bucket of a VERIFY pass mixing chains of different K (graphs.py)."""
        return mixed_verify_tokens(rows, tokens, self.verify_per_row)

    @property
    def max_verify_graph_tokens(self) -> int:
        """VERIFY passes over more tokens than a prefill chunk run eagerly (as EXTEND steps
        past the largest bucket do): each captured shape keeps its activations, and such
        steps are compute-bound, where graphs save little."""
        return max(self.config.extend_graph_max_tokens, self.config.max_num_batched_tokens)

    def _extend_graph_limit(self) -> int:
        """Largest padded EXTEND token count: the knob, at most one step's tokens (prefill
        budget + decoders riding along) and the context length, so that the dummy request's
        positions stay inside RoPE's table and its keys inside req_to_token row 0."""
        cfg = self.config
        return min(cfg.extend_graph_max_tokens, cfg.max_num_batched_tokens + cfg.max_num_seqs,
                   self.max_model_len)

    def _profiles_memory(self) -> bool:
        return self.config.kv_cache_tokens is None and self.device.type == "cuda"

    def _kv_capacity(self) -> int:
        """kv_cache_tokens; a fixed, modest pool on the CPU (pass kv_cache_tokens for more);
        on a GPU the provisional cache the start-up memory profile runs on."""
        if self.config.kv_cache_tokens is not None:
            return self.config.kv_cache_tokens
        if not self.kv_provisional:
            return 16384
        return provisional_slots(self.config, self.max_positions)

    def resize_kv(self, num_slots: int) -> None:
        """Reallocate K and V for `num_slots` slots (contents dropped), in the KVCache every
        backend holds; before any graph captured the old tensors. max_model_len follows."""
        if self.shape_graphs is not None:
            raise RuntimeError("the KV cache cannot move under captured CUDA graphs")
        self.kv.resize(num_slots)
        self.num_slots = num_slots
        self.max_model_len = min(self.max_positions, num_slots)
        self.kv_provisional = False

    def drop_graphs(self) -> None:
        """Forget every captured graph (their private pool goes back once collected): the
        memory profile measures a capture, then the KV cache moves."""
        self.shape_graphs = None
        self.extend_sizes, self.decode_sizes, self.extend_route = [], [], {}
        self._outputs.clear()
        self._retired_outputs.clear()

    def decode_pad(self, bs: int) -> int:
        """The batch size of the decode graph a batch of bs runs on (bs: none)."""
        return pick_bucket(self.decode_sizes, bs) or bs

    def extend_pad(self, num_tokens: int) -> int | None:
        """Padded token count of an EXTEND step: the fastest captured graph at or above its
        bucket (graphs.fastest_at_or_above, timed at capture), None: eager, unpadded."""
        bucket = pick_bucket(self.extend_sizes, num_tokens)
        return self.extend_route.get(bucket, bucket)

    def layout(self, plan: StepPlan) -> Layout:
        """The device shape `plan` runs in (runner/layout.py), chosen once when it is
        planned; BatchBuilder.prepare lays the batch out for it."""
        if plan.mode is ForwardMode.VERIFY:
            depth = max(plan.draft_lens)
            if plan.draft_topk == 1:
                depth = self.chain_depth(depth)
            return verify_layout(self, plan, self.draft_nodes(depth, plan.draft_topk))
        return plain_layout(self, plan)

    def _forward_logits(self, fb: ForwardBatch):
        """-> logits [padded_bs, vocab] in the model dtype, for sample() (and aux features
        [T, 3H] when capturing)."""
        if self.capture:
            hidden, aux = self.model(fb.input_ids, fb.positions, fb, self.attn, self.capture)
            return self.model.compute_logits(hidden[fb.logits_indices], fp32=False), aux
        hidden = self.model(fb.input_ids, fb.positions, fb, self.attn)  # [T, hidden]
        return self.model.compute_logits(hidden[fb.logits_indices], fp32=False)

    def _forward_scored(self, fb: ForwardBatch, lp: LogprobPlan):
        """_forward_logits, and the logprobs of lp's prompt positions from the same hidden
        states (eager)."""
        if self.capture:
            hidden, aux = self.model(fb.input_ids, fb.positions, fb, self.attn, self.capture)
        else:
            hidden = self.model(fb.input_ids, fb.positions, fb, self.attn)
        lp.prompt_out = prompt_logprobs(self.model, hidden, lp)
        logits = self.model.compute_logits(hidden[fb.logits_indices], fp32=False)
        return (logits, aux) if self.capture else logits

    def token_counts(self) -> TokenCounts:
        """The penalties' token-count table (runner/penalties.py), made on first use."""
        if self._counts is None:
            self._counts = TokenCounts(self.config.max_num_seqs + 1,
                                       self.model.config.vocab_size, self.device)
        return self._counts

    @torch.inference_mode()
    def forward(self, batch, all_logits: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The one entry for every step (a StepBatch from BatchBuilder.prepare), keyed by
        its layout; no host sync. -> (out, aux features or None), on the device:
          DECODE / EXTEND: out = sampled token ids ([padded_bs] for DECODE, [batch_size]
            for EXTEND); aux [tokens, ...] of the real tokens. sb.logprobs, when requests
            want them, gets their log-probabilities.
          VERIFY: out = logits [T(+pad), vocab] of the pass's tokens (with chunks riding
            along: of the nodes alone), for verification; aux of every token.
          all_logits (eager; oracles, profiling): out = logits of every token [T, vocab]."""
        fb = batch.forward
        if all_logits:
            return self._forward_all(fb, ())
        self._start_events()
        if fb.mode is ForwardMode.VERIFY:
            out = self._verify_pass(fb, batch.layout.graph, batch.verify.select)
        else:
            out = self._sample_step(fb, batch.sampling, batch.layout.graph)
        if self.last_events:
            self.last_events[1].record()
        return out

    def _sample_step(self, fb: ForwardBatch, sb: SamplingBatch, graph_key: tuple | None
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A DECODE / EXTEND step on the graph its layout names (None: eagerly)."""
        lp = sb.logprobs
        graphs = self.shape_graphs
        graphed = graph_key is not None and graphs is not None and graph_key in graphs.entries
        if lp is not None and lp.prompt_rows is not None:  # (its layout is eager)
            graphed, out = False, self._forward_scored(fb, lp)
        elif graphed:  # captured at start-up: the body only stands in for the record
            out = graphs.run(graph_key, self._plain_body(fb), graph_inputs(fb))
        else:
            out = self._forward_logits(fb)
        self.step_counts[f"{fb.mode.value}_{'graphed' if graphed else 'eager'}"] += 1
        logits, aux = out if self.capture else (out, None)
        if fb.mode is ForwardMode.DECODE:  # graph-sized rows (sb is padded alike)
            tokens = self.sample_tokens(logits[: fb.padded_batch_size], sb)
        else:  # EXTEND: the real requests' rows; aux of the real tokens (they come first)
            tokens = self.sample_tokens(logits[: fb.batch_size], sb)
            if aux is not None and fb.padded_batch_size > fb.batch_size:
                aux = aux[: sum(fb.extend_lens_cpu[: fb.batch_size])]
        return tokens, aux

    def sample_tokens(self, logits: torch.Tensor, sb: SamplingBatch) -> torch.Tensor:
        """logits [B, V] -> tokens [B]: penalties and grammar masks (only where requests use
        them), sampling, then the sampled tokens counted for the penalties and their
        logprobs taken from the raw logits."""
        pb, lp, raw, counts = sb.penalties, sb.logprobs, logits, None
        if pb is not None:
            if pb.use_counts:
                counts = self.token_counts()
                counts.reset(pb)
            logits = pb.apply(logits, counts, None, sb.steps)
        if sb.grammar is not None:  # after the penalties (the grammar wins over min_tokens)
            logits = sb.grammar.apply(logits, banned=pb is not None and pb.banned is not None)
        tokens = sample(logits, sb)
        if counts is not None:
            counts.record(pb.rows, tokens, pb.record)
        if lp is not None and lp.sampled:
            lp.sampled_out = token_logprobs(raw[lp.sampled_dev], tokens[lp.sampled_dev], lp.top_n)
        return tokens

    def graph_stats(self) -> dict[str, int]:
        """How many steps replayed a graph / ran eagerly, per mode (for stats / bench)."""
        return {f"{m}_{k}": self.step_counts[f"{m}_{k}"]
                for m in ("decode", "extend", "verify") for k in ("graphed", "eager")}

    def _forward_all(self, fb: ForwardBatch, capture: tuple[int, ...],
                     logits_out: torch.Tensor | None = None, mm_out: torch.Tensor | None = None,
                     rows: torch.Tensor | None = None):
        if capture:
            hidden, aux = self.model(fb.input_ids, fb.positions, fb, self.attn, capture)
        else:
            hidden, aux = self.model(fb.input_ids, fb.positions, fb, self.attn), None
        if rows is not None:
            hidden = hidden.index_select(0, rows)
        return self.model.compute_logits(hidden, out=logits_out, mm_out=mm_out), aux

    def _shared_out(self, name: str, rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
        """[rows, cols] of one persistent buffer per name that every VERIFY-shape graph
        writes its output into. Graphs replay one at a time and a step consumes its outputs
        before the next replay, so they can share it; a graph's own outputs would stay
        allocated per captured shape ([T, vocab] fp32 each: tens of GB over the warm-up's
        shapes). Growing retires the old buffer (graphs captured against it keep it)."""
        buf = self._outputs.get(name)
        if buf is None or buf.shape[0] < rows or buf.shape[1] != cols:
            if buf is not None:
                self._retired_outputs.append(buf)
            buf = self._outputs[name] = torch.empty(rows, cols, dtype=dtype, device=self.device)
        return buf[:rows]

    def _verify_pass(self, fb: ForwardBatch, graph_key: tuple | None,
                     rows: torch.Tensor | None):
        """Logits of every token [T, vocab] of a VERIFY pass, or of token rows `rows` alone
        (an eager pass whose prefill chunks ride along: the nodes, not every chunk token),
        and aux features of every token when the draft consumes them. With `graph_key`
        the pass runs as the CUDA graph captured for that key."""
        capture = self.capture
        graphed = graph_key is not None and self.shape_graphs is not None
        self.step_counts[f"verify_{'graphed' if graphed else 'eager'}"] += 1
        if graphed:
            t, h = fb.num_tokens, self.model.config.hidden_size
            logits = self._shared_out("logits", t, self.model.config.vocab_size, torch.float32)
            aux = self._shared_out("aux", t, len(capture) * h, self.dtype) if capture else None

            # the lm_head's bf16 product too: a graph keeps its intermediates for itself, and
            # [T, vocab] per shape would run a GPU out of memory over the warm-up's tree shapes
            mm = self._shared_out("logits_mm", t, self.model.config.vocab_size, self.dtype)

            def body(s):  # writes the shared outputs: no [T, vocab] kept alive per shape
                out, feats = self._forward_all(rebuild_batch(fb, s), capture, logits_out=logits,
                                               mm_out=mm)
                if aux is not None:
                    aux.copy_(feats)
                return out, aux

            return self.shape_graphs.run(("target",) + graph_key, body, graph_inputs(fb))
        return self._forward_all(fb, capture, rows=rows)

    def _start_events(self) -> None:
        if self.device.type == "cuda":
            self.last_events = (torch.cuda.Event(enable_timing=True),
                                torch.cuda.Event(enable_timing=True))
            self.last_events[0].record()

    @property
    def runs_on_host(self) -> bool:
        """The device's work runs on the host thread as it is launched (a CPU): a step's wall
        time is its cost, overlapped or not."""
        return self.device.type == "cpu"

    def last_device_ms(self) -> float | None:
        """Device time of the latest forward() (forward + sampling). Call only after the host
        has synchronised on that step's tokens, so reading the events never waits."""
        return device_ms(self.last_events)


_GRAPH_FIELDS = ("input_ids", "positions", "out_cache_loc", "req_pool_indices", "seq_lens",
                 "extend_lens", "extend_start_loc", "prefix_lens", "logits_indices")


def graph_inputs(fb: ForwardBatch) -> dict[str, torch.Tensor]:
    out = {name: getattr(fb, name) for name in _GRAPH_FIELDS}
    if fb.tree is not None:
        out.update(tree_rows=fb.tree.token_rows, tree_prefix=fb.tree.prefix_lens,
                   tree_extra=fb.tree.extra_slots)
    return out


def rebuild_batch(fb: ForwardBatch, static: dict[str, torch.Tensor]) -> ForwardBatch:
    """The same batch over the graph's static tensors (host fields are shape constants)."""
    from dataclasses import replace

    fields = {k: v for k, v in static.items() if k in _GRAPH_FIELDS}  # others: the caller's
    if fb.tree is not None:
        fields["tree"] = replace(fb.tree, token_rows=static["tree_rows"],
                                 prefix_lens=static["tree_prefix"], extra_slots=static["tree_extra"])
    return replace(fb, **fields)


def device_ms(events: tuple[torch.cuda.Event, torch.cuda.Event] | None) -> float | None:
    """Milliseconds between a recorded (start, end) pair; None without events."""
    return events[0].elapsed_time(events[1]) if events else None
