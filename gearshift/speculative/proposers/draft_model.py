"""A separate small draft model (any supported architecture, the target's tokenizer and
vocabulary) with its own KV cache on the same slot ids.

Data flow: SpecRunner -> draft_extend (draft LM over committed tokens, row t = token t) ->
propose: one DRAFT forward over the pending tokens, then drafter.expand.
"""

from __future__ import annotations

from pathlib import Path

import torch

from gearshift.attention.base import KVCache, create_backend
from gearshift.config import ConfigError, EngineConfig, ModelConfig
from gearshift.forward_batch import ForwardBatch
from gearshift.models.loader import DTYPES, load_model
from gearshift.speculative.proposers.base import ProposeContext, Proposer
from gearshift.speculative.proposers.expand import ExpandInputs, _draft_batch, expand, graph_step
from gearshift.speculative.tree import DraftTree


class DraftModelProposer(Proposer):
    def __init__(self, config: EngineConfig, target_cfg: ModelConfig, target_kv: KVCache,
                 max_positions: int) -> None:
        cfg = ModelConfig.from_dir(config.draft_model)
        if cfg.vocab_size != target_cfg.vocab_size:
            raise ConfigError(f"draft model vocabulary ({cfg.vocab_size}) differs from the "
                              f"target's ({target_cfg.vocab_size}): they must share a tokenizer")
        self.model = load_model(cfg, Path(config.draft_model), dtype=config.dtype,
                                device=config.device, max_positions=max_positions)
        n_slots = target_kv.k.shape[1] - 1
        kv = KVCache.allocate(cfg.num_layers, n_slots, cfg.num_kv_heads, cfg.head_dim, 1, 1,
                              DTYPES[config.dtype], target_kv.k.device)
        kv.req_to_token = target_kv.req_to_token  # same slot ids as the target
        self.kv = kv
        self.attn = create_backend(config.attention_backend, kv, cfg.head_dim ** -0.5)
        self.vocab = cfg.vocab_size

    def weights(self) -> torch.nn.Module:
        return self.model

    def scratch_slots(self, k: int, topk: int) -> int:
        return 1 + (k - 1) * topk  # the pending token's row, then the beams of depths 1..K-1

    def resize_slots(self, num_slots: int) -> None:
        self.kv.resize(num_slots)

    def draft_extend(self, fb: ForwardBatch, features: torch.Tensor | None) -> None:
        self.model(fb.input_ids, fb.positions, fb, self.attn)

    def _forward_step(self, ids, hidden, fb):
        h = self.model(ids, fb.positions, fb, self.attn)
        return self.model.compute_logits(h), None

    def _step(self, ids, hidden, fb):
        return graph_step(self, "draft", self._forward_step, ids, hidden, fb)

    def propose(self, ctx: ProposeContext) -> tuple[DraftTree, None]:
        root_slot = ctx.scratch[:, :1]
        pos = ctx.prefix_lens.clamp_max(self.runner.max_positions - 1)
        fb = _draft_batch(ctx.roots, pos, root_slot[:, 0], ctx.rows, ctx.prefix_lens,
                          root_slot, max(ctx.prefix_lens_cpu))
        first, _ = self._step(ctx.roots, None, fb)
        x = ExpandInputs(ctx.roots, first, None, ctx.prefix_lens, ctx.rows, ctx.scratch[:, 1:],
                         root_slot, 0, ctx.max_depth, ctx.topk, ctx.num_nodes,
                         max(ctx.prefix_lens_cpu), self.runner.max_positions - 1, ctx.counts)
        return expand(x, self._step, ctx.sampling, None, self.vocab), None
