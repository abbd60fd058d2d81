"""Draft-tree expansion shared by the model-based proposers (EAGLE-3 head, draft model).

Depth 1 comes from the proposer's first-level logits. Each further depth runs ONE draft
forward over the current beams (W = topk rows per request, tree attention over the
committed draft KV plus the beam's ancestors' scratch slots), then
  * chains (topk = 1): the next token is the argmax, or a sample of the processed draft
    distribution q for sampling requests (q is kept for rejection sampling);
  * trees (topk > 1): every beam's top-k children become candidates scored by cumulative
    draft log-probability; the best topk candidates are the next beams (EAGLE-2 style).
Requests that couple (speculative/coupled.py) take their chain's token, or rank their
children, by the race with the target's numbers for that output index instead.
Finally the best (tree_budget - 1) candidates form the tree (ancestors always score
higher than their descendants, so the selection is ancestor-closed).

Requests with penalties (runner/penalties.py) get them on the draft's logits too, each beam
with the drafts on its own path counted, as the target will apply them at that node: the
drafts then follow the distribution that verification accepts from (losslessness comes
from verification alone; this is for acceptance). Requests with a grammar propose their
first level under its mask. Such expansions run eagerly.

Data flow: SpecRunner -> Proposer.propose -> expand(...) -> DraftTree. No host sync;
with CUDA graphs the whole expansion (all depths, selection, ancestor masks) is one graph
per shape (`graphed_expand`), so a VERIFY step's drafting launches no eager glue.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from gearshift.forward_batch import ForwardBatch, ForwardMode, TreeAttention
from gearshift.runner.penalties import TokenCounts
from gearshift.runner.sampler import SamplingBatch, apply_top_k_top_p, seeded_uniform
from gearshift.speculative import coupled
from gearshift.speculative.tree import DraftTree, ancestor_mask
from gearshift.speculative.verify import SALT_DRAFT
from gearshift.structured.mask import constrain, draft_blocked

# (token ids [R] in target vocab, hidden [R, H] | None, ForwardBatch) -> (logits [R, Vd], hidden)
StepFn = Callable[[torch.Tensor, torch.Tensor | None, ForwardBatch],
                  tuple[torch.Tensor, torch.Tensor | None]]


@dataclass(slots=True)
class ExpandInputs:
    roots: torch.Tensor  # [B] pending tokens
    first_logits: torch.Tensor  # [B, Vd] draft logits for depth 1
    first_hidden: torch.Tensor | None  # [B, H] (EAGLE-3: the prenorm hidden that made them)
    prefix_lens: torch.Tensor  # [B] int64: committed tokens L (draft KV rows 0..L-1 exist)
    rows: torch.Tensor  # [B] int64 req_to_token rows
    scratch: torch.Tensor  # [B, (K-1) * topk] int64 scratch slots (0 = dummy for idle rows)
    base_scratch: torch.Tensor  # [B, nb] slots every draft row also sees (draft model: root)
    pos_offset: int  # position of a depth-d beam's row = L + d + pos_offset
    depth: int  # K
    topk: int
    num_nodes: int  # verify budget incl. the root (chain: K + 1)
    max_prefix_len: int  # host max of prefix_lens
    max_position: int = 1 << 30  # rows deeper than their request's K are junk: clamp to RoPE
    counts: TokenCounts | None = None  # the penalties' token counts (sb.penalties.use_counts)
    # [B, K + 1, V] to write sampled chains' q into (a persistent buffer: graphed_expand)
    q_out: torch.Tensor | None = None


def process_probs(logits: torch.Tensor, sb: SamplingBatch) -> torch.Tensor:
    """Draft distribution q with the requests' temperature / top-k / top-p. [B, V]."""
    probs = torch.softmax(logits / sb.temperatures[:, None].clamp_min(1e-5), dim=-1)
    if sb.need_top_k or sb.need_top_p:
        probs = apply_top_k_top_p(probs, sb.top_k, sb.top_p, sb.need_top_k, sb.need_top_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def expand(x: ExpandInputs, step: StepFn, sb: SamplingBatch, to_target: torch.Tensor | None,
           target_vocab: int) -> DraftTree:
    b, k, w = x.roots.shape[0], x.depth, x.topk
    dev = x.roots.device
    to_t = (lambda ids: to_target[ids]) if to_target is not None else (lambda ids: ids)
    # rejection-sampled chains draw from q (kept for verification); coupled requests race
    # with the target's numbers (speculative/coupled.py)
    sampling = w == 1 and not sb.all_greedy and not sb.all_coupled
    couples = sb.coupled is not None and not sb.all_greedy
    cand_tok, cand_score, cand_parent, qs = [], [], [], []
    pen = sb.penalties
    # grammars: the first level proposes under the pending position's mask (deeper levels
    # would need each beam's matcher on the host; verification alone keeps them valid)
    first_blocked = None if sb.grammar is None else draft_blocked(
        sb.grammar.bitmask, target_vocab, to_target, x.first_logits.shape[-1])  # [B, Vd]

    def choose(logits: torch.Tensor, depth_index: int, path: torch.Tensor | None):
        """[B, W, Vd] -> (tokens [B, W*topk or W], logp, parent beam [.]) for one depth;
        path [B, W, depth_index]: each beam's drafts so far (draft vocabulary ids)."""
        if pen is not None:
            logits = _penalised(logits, path, depth_index, pen, x.counts, sb.steps, to_target,
                                target_vocab)
        if first_blocked is not None and depth_index == 0:  # logits [B, 1, Vd]
            logits = constrain(logits[:, 0], first_blocked, pen is not None)[:, None, :]
        logp = torch.log_softmax(logits.float(), dim=-1)
        rank = logp
        if couples and w > 1:  # trees rank children by the race; chains need its winner only
            race = coupled.draft_scores(logits, sb, depth_index, to_target)  # [B, W, Vd]
            rank = coupled.per_row(sb, torch.log_softmax(race, dim=-1), logp)
        if w > 1:
            top = rank.topk(w, dim=-1)  # [B, W, w]
            return top.indices.flatten(1), top.values.flatten(1), None
        ids = logits.argmax(-1)  # [B, 1]
        if sampling:
            q = process_probs(logits[:, 0], sb)  # [B, Vd]
            exp = -torch.log(seeded_uniform(sb.seeds ^ SALT_DRAFT, sb.steps + depth_index,
                                            q.shape[-1]))
            drawn = (q / exp).argmax(-1, keepdim=True)
            greedy = sb.temperatures[:, None] == 0
            ids = torch.where(greedy, ids, drawn)
            onehot = torch.zeros_like(q).scatter_(-1, ids, 1.0)
            qs.append(torch.where(greedy, onehot, q))
        if couples:
            ids = coupled.per_row(sb, coupled.draft_tokens(logits, sb, depth_index, to_target), ids)
        return ids, logp.gather(-1, ids[..., None])[..., 0], None

    # depth 1
    # drafts before each beam's token, kept for penalised requests only
    tok, lp, _ = choose(x.first_logits[:, None, :], 0,
                        x.roots.new_zeros(b, 1, 0) if pen is not None else None)  # [B, w]
    beam_tok, beam_score = tok, lp
    beam_path = x.roots.new_zeros(b, w, 0) if pen is not None else None
    beam_node = torch.arange(w, device=dev).expand(b, w)  # candidate index of each beam
    beam_hidden = (x.first_hidden[:, None, :].expand(b, w, -1)
                   if x.first_hidden is not None else None)
    beam_anc = torch.empty(b, w, 0, dtype=torch.long, device=dev)  # ancestors' scratch slots
    cand_tok.append(tok)
    cand_score.append(lp)
    cand_parent.append(torch.full((b, w), -1, dtype=torch.long, device=dev))
    base = x.base_scratch
    for d in range(2, k + 1):
        own = x.scratch[:, (d - 2) * w:(d - 1) * w]  # [B, W]
        extra = torch.cat([base[:, None, :].expand(b, w, -1), beam_anc, own[..., None]], dim=-1)
        positions = (x.prefix_lens[:, None] + (d - 1 + x.pos_offset)).clamp_max(x.max_position)
        fb = _draft_batch(to_t(beam_tok).reshape(-1), positions.expand(b, w).reshape(-1),
                          own.reshape(-1), x.rows[:, None].expand(b, w).reshape(-1),
                          x.prefix_lens[:, None].expand(b, w).reshape(-1), extra.reshape(b * w, -1),
                          x.max_prefix_len)
        hid = beam_hidden.reshape(b * w, -1) if beam_hidden is not None else None
        logits, new_hidden = step(fb.input_ids, hid, fb)
        logits = logits.view(b, w, -1)
        path = None if pen is None else torch.cat([beam_path, beam_tok[..., None]], -1)  # [B, W, d-1]
        tok, lp, _ = choose(logits, d - 1, path)
        n_prev = sum(t.shape[1] for t in cand_tok)
        if w > 1:
            score = (beam_score[:, :, None] + lp.view(b, w, w)).flatten(1)  # [B, w*w]
            parent_beam = torch.arange(w, device=dev).repeat_interleave(w).expand(b, -1)
        else:
            score, parent_beam = beam_score + lp, torch.zeros(b, 1, dtype=torch.long, device=dev)
        cand_tok.append(tok)
        cand_score.append(score)
        cand_parent.append(beam_node.gather(1, parent_beam))
        keep = score.topk(w, dim=-1).indices  # [B, w] best candidates become beams
        pb = parent_beam.gather(1, keep)
        if pen is not None:
            beam_path = path.gather(1, pb[..., None].expand(-1, -1, path.shape[-1]))
        beam_tok, beam_score = tok.gather(1, keep), score.gather(1, keep)
        beam_node = n_prev + keep
        if new_hidden is not None:
            beam_hidden = new_hidden.view(b, w, -1).gather(
                1, pb[..., None].expand(-1, -1, new_hidden.shape[-1]))
        beam_anc = torch.cat([beam_anc.gather(1, pb[..., None].expand(-1, -1, beam_anc.shape[-1])),
                              own.gather(1, pb)[..., None]], dim=-1)
    return _select(x, cand_tok, cand_score, cand_parent, qs, to_t, target_vocab, to_target)


def _penalised(logits: torch.Tensor, path: torch.Tensor, depth_index: int, pen, counts,
               steps: torch.Tensor, to_target: torch.Tensor | None, target_vocab: int):
    """Draft logits [B, W, Vd] with the requests' penalties, as the target will apply them
    at the node these beams' children verify at: output index steps + depth_index, the
    beam's path counted."""
    b, w, v = logits.shape
    req = torch.arange(b, device=logits.device).repeat_interleave(w)  # [B * W]
    extra = None
    if pen.use_counts and path.shape[-1]:
        extra = torch.zeros(b * w, v, dtype=torch.int32, device=logits.device).scatter_add_(
            1, path.reshape(b * w, -1), torch.ones_like(path, dtype=torch.int32).view(b * w, -1))
    out = pen.apply(logits.reshape(b * w, v), counts, req, steps[req] + depth_index, extra,
                    cols=to_target, vocab=target_vocab)
    return out.view(b, w, v)


def _select(x: ExpandInputs, cand_tok, cand_score, cand_parent, qs, to_t, target_vocab,
            to_target) -> DraftTree:
    tokens = torch.cat(cand_tok, dim=1)  # [B, M]
    scores = torch.cat(cand_score, dim=1)
    parents = torch.cat(cand_parent, dim=1)
    b, m = tokens.shape
    n = min(x.num_nodes - 1, m)
    sel = scores.topk(n, dim=-1).indices.sort(-1).values  # creation order = topological
    lookup = torch.full((b, m + 1), -1, dtype=torch.long, device=tokens.device)  # cand -> node
    lookup.scatter_(1, sel, torch.arange(1, n + 1, device=tokens.device).expand(b, n))
    par = parents.gather(1, sel)  # candidate index of the parent, -1 = root
    node_parent = torch.where(par < 0, 0, lookup.gather(1, par.clamp_min(0)))  # -1: not kept
    depth = torch.zeros(b, n + 1, dtype=torch.long, device=tokens.device)
    full_parent = torch.cat([torch.full((b, 1), -1, device=tokens.device, dtype=torch.long),
                             node_parent], dim=1)
    for _ in range(x.depth):  # depth = 1 + depth(parent); nodes are topologically ordered
        depth = torch.where(full_parent >= 0, depth.gather(1, full_parent.clamp_min(0)) + 1, 0)
    probs = None
    if qs:  # chains only: q over the target vocabulary, row per node (the root's zero)
        q = torch.stack(qs, dim=1)  # [B, K, Vd]
        vocab = target_vocab if to_target is not None else q.shape[-1]
        probs = x.q_out.zero_() if x.q_out is not None else q.new_zeros(b, q.shape[1] + 1, vocab)
        if to_target is not None:
            probs[:, 1:].index_add_(2, to_target, q)
        else:
            probs[:, 1:].copy_(q)
    node_tokens = torch.cat([x.roots[:, None], to_t(tokens.gather(1, sel))], dim=1)
    return DraftTree(node_tokens, full_parent, depth, probs)


def _draft_batch(input_ids, positions, out_loc, token_rows, prefix_lens, extra, max_prefix):
    r = input_ids.shape[0]
    ones = torch.ones(r, dtype=torch.int32, device=input_ids.device)
    ar = torch.arange(r, device=input_ids.device)
    return ForwardBatch(
        mode=ForwardMode.DRAFT, batch_size=r, padded_batch_size=r, num_tokens=r,
        input_ids=input_ids, positions=positions, out_cache_loc=out_loc,
        req_pool_indices=token_rows, seq_lens=(prefix_lens + 1).to(torch.int32),
        extend_lens=ones, extend_start_loc=ar.to(torch.int32),
        prefix_lens=prefix_lens.to(torch.int32), logits_indices=ar, seq_lens_cpu=[],
        extend_lens_cpu=[], prefix_lens_cpu=[], max_seq_len=max_prefix + 1, max_extend_len=1,
        tree=TreeAttention(token_rows, prefix_lens.to(torch.int32), extra, max_prefix),
    )


def graph_step(proposer, name: str, forward, ids, hidden, fb: ForwardBatch):
    """Run one DRAFT step, as a CUDA graph per (rows, extra-key width) when the runner
    captures graphs; eagerly otherwise."""
    runner = getattr(proposer, "runner", None)
    graphs = runner.shape_graphs if runner is not None else None
    if graphs is None:
        return forward(ids, hidden, fb)
    t = fb.tree
    inputs = {"ids": ids, "positions": fb.positions, "out": fb.out_cache_loc,
              "rows": t.token_rows, "prefix": t.prefix_lens.long(), "extra": t.extra_slots}
    if hidden is not None:
        inputs["hidden"] = hidden.contiguous()

    def fn(s):
        sfb = _draft_batch(s["ids"], s["positions"], s["out"], s["rows"], s["prefix"], s["extra"],
                           t.max_prefix_len)
        return forward(s["ids"], s.get("hidden"), sfb)

    key = (name, ids.shape[0], t.extra_slots.shape[1], hidden is not None)
    return graphs.run(key, fn, inputs)


SAMPLING_FIELDS = ("temperatures", "top_p", "top_k", "seeds", "steps")


def graphed_expand(graphs, name: str, x: ExpandInputs, first, step: StepFn, sb: SamplingBatch,
                   to_target: torch.Tensor | None, target_vocab: int,
                   q_rows=None) -> DraftTree:
    """`expand` as ONE graph per shape (rows, K, topk, nodes, sampling flags): the draft's
    depth-1 logits (`first(roots-side inputs) -> (logits, hidden)`), every draft step, the
    selection and the tree's ancestor mask. Without `graphs`: the same, eagerly.
    `first(s)` reads the static inputs `s` ("rows" etc.); `step` is an un-graphed step.
    The host max prefix length is a shape constant of the graph (the graph-safe tree
    attention never reads it; the torch reference that does runs eagerly).
    `q_rows(rows, nodes)`: a view of the persistent buffer rejection-sampled chains write
    their q into when graphed (one copy per captured shape grows with every batch size)."""

    # static inputs: what the expansion reads (sampled chains and coupled requests read
    # the sampling fields)
    couples = sb.coupled is not None and not sb.all_greedy
    fields = SAMPLING_FIELDS if (x.topk == 1 or couples) and not sb.all_greedy else ()
    fields += ("coupled",) if couples else ()
    base = x.base_scratch if x.base_scratch.shape[1] else None
    # one filter flag: top-k and top-p share their sort, and a row without either keeps
    # every token, so a batch asking for one runs both (half the graph variants to warm up)
    filters = sb.need_top_k or sb.need_top_p

    def fn(s):
        logits, hidden = first(s)
        xs = replace(x, roots=s["roots"], first_logits=logits, first_hidden=hidden,
                     prefix_lens=s["prefix"], rows=s["rows"], scratch=s["scratch"],
                     base_scratch=s["base"] if base is not None else x.base_scratch)
        sbs = replace(sb, need_top_k=filters, need_top_p=filters, **{f: s[f] for f in fields})
        tree = expand(xs, step, sbs, to_target, target_vocab)
        tree.ancestors = ancestor_mask(tree.parents, x.depth)
        return tree

    inputs = {"roots": x.roots, "prefix": x.prefix_lens, "rows": x.rows, "scratch": x.scratch,
              **({"base": base} if base is not None else {}), **{f: getattr(sb, f) for f in fields}}
    if graphs is None or sb.penalties is not None or sb.grammar is not None:  # eager
        return fn(inputs)
    if q_rows is not None and x.topk == 1 and not sb.all_greedy and not sb.all_coupled:
        x = replace(x, q_out=q_rows(x.roots.shape[0], x.depth + 1))
    # the body reads these host flags (any_greedy it does not: greedy rows are masked)
    key = (name, "expand", x.roots.shape[0], x.depth, x.topk, x.num_nodes, x.scratch.shape[1],
           x.base_scratch.shape[1], couples, sb.all_coupled, sb.all_greedy, filters)
    return graphs.run(key, fn, inputs)
