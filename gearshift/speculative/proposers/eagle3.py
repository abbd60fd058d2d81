"""EAGLE-3 proposer: a one-layer draft head fed with three target layers' hidden states.

Draft row t consumes (token t+1, target feature of position t) and predicts token t+2;
`draft_extend` runs it over newly committed rows and stores, per request, the last row's
prenorm hidden state: the seed of the next step's depth 1 (its draft logits are computed
when a VERIFY step proposes, so steps at K = 0 skip the draft lm_head). Single-token
extends (every request decoding) are graph-safe: SpecRunner replays them as a CUDA graph.

Data flow: target forward (captures aux layers) -> commit -> draft_extend(features) ->
[next VERIFY step] propose: seeds -> drafter.expand (K-1 head steps) -> DraftTree.
"""

from __future__ import annotations

import torch

from gearshift.attention.base import KVCache, create_backend
from gearshift.config import EngineConfig, ModelConfig
from gearshift.forward_batch import ForwardBatch
from gearshift.models.eagle3_loader import load_eagle3
from gearshift.models.loader import DTYPES
from gearshift.speculative.proposers.base import ProposeContext, Proposer
from gearshift.speculative.proposers.expand import ExpandInputs, graphed_expand
from gearshift.speculative.tree import DraftTree


class Eagle3Proposer(Proposer):
    needs_features = True
    shifted_inputs = True
    graph_extend = True  # draft_extend has static shapes for a padded 1-token-per-row batch

    def __init__(self, config: EngineConfig, head_dir: str, target_cfg: ModelConfig,
                 target_model: torch.nn.Module, target_kv: KVCache, max_positions: int,
                 max_rows: int) -> None:
        self.head = load_eagle3(head_dir, target_cfg, dtype=config.dtype, device=config.device,
                                max_positions=max_positions, target_embed=target_model.embed_tokens)
        cfg = self.head.config
        self.aux_layers = tuple(cfg.aux_layer_ids(target_cfg.num_layers))
        dev = target_kv.k.device
        kv = KVCache.allocate(1, target_kv.k.shape[1] - 1, cfg.num_kv_heads, cfg.head_dim, 1, 1,
                              DTYPES[config.dtype], dev)
        kv.req_to_token = target_kv.req_to_token  # same slot ids as the target
        self.kv = kv
        self.attn = create_backend(config.attention_backend, kv, cfg.head_dim ** -0.5)
        self.target_vocab = target_cfg.vocab_size
        self.max_positions = max_positions
        dtype = DTYPES[config.dtype]
        self.seed_hidden = torch.zeros(max_rows + 1, cfg.hidden_size, dtype=dtype, device=dev)
        # fc(target features) of tokens the draft has not caught up on, by KV slot
        self.features = torch.zeros(target_kv.k.shape[1], cfg.hidden_size, dtype=dtype, device=dev)
        self.to_target = torch.arange(cfg.draft_vocab_size, device=dev) + self.head.d2t  # [Vd]
        self._q_shape = (max_rows, config.num_draft_tokens + 1)  # rows, nodes at least
        self._q: torch.Tensor | None = None  # q_rows's buffer, made at first use

    def q_rows(self, rows: int, nodes: int) -> torch.Tensor:
        """[rows, nodes, V] of one persistent buffer: where every expansion graph of
        rejection-sampled chains writes their draft distributions (read by the same step's
        verification), instead of each graph keeping [B, K + 1, V] floats of its own."""
        q = self._q
        if q is None or q.shape[0] < rows or q.shape[1] < nodes:
            q = self._q = torch.empty(max(rows, self._q_shape[0]), max(nodes, self._q_shape[1]),
                                      self.target_vocab, device=self.features.device)
        return q[:rows, :nodes]

    def weights(self) -> torch.nn.Module:
        return self.head

    def scratch_slots(self, k: int, topk: int) -> int:
        return (k - 1) * topk

    def resize_slots(self, num_slots: int) -> None:
        self.features = None  # freed before the new ones are made
        self.kv.resize(num_slots)
        self.features = torch.zeros(num_slots + 1, self.head.config.hidden_size,
                                    dtype=self.seed_hidden.dtype, device=self.seed_hidden.device)

    def draft_extend(self, fb: ForwardBatch, features: torch.Tensor | None) -> None:
        h = self.head(fb.input_ids, features, fb.positions, fb, self.attn)  # [T, H]
        last = h[fb.logits_indices]  # [B, H]
        self.seed_hidden[fb.req_pool_indices] = last

    def store_features(self, slots: torch.Tensor, aux: torch.Tensor) -> None:
        self.features[slots] = self.head.fc(aux)  # [T, 3*H_t] -> [T, H]: the head skips fc

    def stored_features(self) -> torch.Tensor:
        return self.features

    def _forward_step(self, ids, hidden, fb):
        h = self.head(ids, hidden, fb.positions, fb, self.attn)
        return self.head.compute_logits(h), h

    def _first(self, s: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        seed = self.seed_hidden[s["rows"]]  # [B, H]
        return self.head.compute_logits(seed).float(), seed  # [B, Vd], [B, H]

    def propose(self, ctx: ProposeContext) -> tuple[DraftTree, None]:
        """The whole expansion (seed logits, K - 1 head steps, selection) is one CUDA graph
        per shape when the runner captures graphs."""
        b = ctx.roots.shape[0]
        runner = getattr(self, "runner", None)
        graphs = runner.shape_graphs if runner is not None else None
        if ctx.sampling.penalties is not None or ctx.sampling.grammar is not None:
            graphs = None  # penalised or constrained proposals run eagerly, unpadded
        # graphed: pad the batch to a decode graph size (dummy row 0, prefix 0, slot 0), so
        # batch sizes share graphs instead of each capturing its own while requests finish
        pad = runner.decode_pad(b) - b if graphs is not None else 0
        roots, prefix, rows, scratch, sb = _pad_rows(pad, ctx.roots, ctx.prefix_lens, ctx.rows,
                                                    ctx.scratch, ctx.sampling)
        x = ExpandInputs(roots, None, None, prefix, rows, scratch, scratch.new_zeros(b + pad, 0),
                         -1, ctx.max_depth, ctx.topk, ctx.num_nodes, max(ctx.prefix_lens_cpu),
                         self.max_positions - 1, ctx.counts)
        tree = graphed_expand(graphs, "eagle3", x, self._first, self._forward_step, sb,
                              self.to_target, self.target_vocab, self.q_rows)
        if pad:
            tree = DraftTree(*(None if t is None else t[:b] for t in (
                tree.tokens, tree.parents, tree.depths, tree.draft_probs, tree.ancestors)))
        return tree, None


def _pad_rows(pad: int, roots, prefix, rows, scratch, sb):
    """`pad` dummy requests after the real ones: token 0, prefix 0, row 0, scratch slot 0,
    greedy sampling (not coupled)."""
    if not pad:
        return roots, prefix, rows, scratch, sb
    from dataclasses import replace

    def more(t: torch.Tensor, value) -> torch.Tensor:
        return torch.cat([t, t.new_full((pad, *t.shape[1:]), value)])

    sb = replace(sb, temperatures=more(sb.temperatures, 0.0), top_p=more(sb.top_p, 1.0),
                 top_k=more(sb.top_k, -1), seeds=more(sb.seeds, 0), steps=more(sb.steps, 0),
                 coupled=None if sb.coupled is None else more(sb.coupled, False))
    return more(roots, 0), more(prefix, 0), more(rows, 0), more(scratch, 0), sb
