"""Penalties and constraints on the logits before sampling: min_tokens, logit_bias, then
repetition (HF: prompt + generated tokens), frequency and presence (OpenAI: generated
tokens), in that order (as vLLM), on the raw logits, before temperature / top-k / top-p:

    x = logits;  x[t] = -inf for EOS / stop ids while out_index < min_tokens
    x[t] += bias[t]
    x[t] = x[t] / rep if x[t] > 0 else x[t] * rep       where t is in prompt or generated
    x[t] -= frequency * count[t] + presence * (count[t] > 0)

Token counts live on the device, one row per req_to_token row, so no step waits for the
host (an overlapped step's tokens are counted where they are sampled):

    TokenCounts.table  [max_num_seqs + 1, vocab] int32     row 0: the dummy row
        bits 0..29: how often the request generated the token;  bit 30: in its prompt

(max_num_seqs + 1) x vocab x 4 bytes, allocated when the first request with a count-based
penalty arrives: 66 MB for 128 rows of a 128k vocabulary. A row is rebuilt from the
request's tokens when the request is given a row (admission, and again after preemption).

A VERIFY step processes the logits of every verified node: node j of a request sees the
request's counts plus the drafts on its own path (its ancestors and itself, not the
root), and min_tokens at output index steps + depth, exactly what a plain step at that
position sees. A batch where no request uses any of this builds no PenaltyBatch and
launches nothing here.

Data flow: BatchBuilder.prepare -> stage_penalties (in the step's one copy) ->
penalty_batch -> SamplingBatch.penalties -> ModelRunner.forward / SpecRunner.run: apply, then
record the sampled / accepted tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gearshift.request import Request

PROMPT_BIT = 1 << 30
COUNT_MASK = PROMPT_BIT - 1


class TokenCounts:
    """The [rows, vocab] count table (see the module doc)."""

    def __init__(self, rows: int, vocab: int, device: torch.device) -> None:
        self.table = torch.zeros(rows, vocab, dtype=torch.int32, device=device)

    @staticmethod
    def nbytes(rows: int, vocab: int) -> int:
        return rows * vocab * 4

    def reset(self, pb: PenaltyBatch) -> None:
        """Rebuild the rows given to requests in this step from their tokens so far."""
        if pb.init is None:
            return
        rows, prompt_rows, prompt_toks, out_rows, out_toks = pb.init
        self.table[rows] = 0
        self.table[prompt_rows, prompt_toks] = PROMPT_BIT  # repeats write the same value
        self.table.index_put_((out_rows, out_toks), torch.ones_like(out_toks, dtype=torch.int32),
                              accumulate=True)

    def record(self, rows: torch.Tensor, tokens: torch.Tensor, keep: torch.Tensor) -> None:
        """count[row, token] += keep, elementwise over equal shapes (keep: 0 or 1)."""
        self.table.index_put_((rows, tokens), keep.to(torch.int32), accumulate=True)


@dataclass(slots=True)
class PenaltyBatch:
    """Per-row penalty inputs of one step (BatchBuilder writes it, in the step's one copy).
    Rows are the step's sampling rows (DECODE: padded with neutral rows)."""

    rows: torch.Tensor  # [B] int64: req_to_token row of each request (count-table row)
    presence: torch.Tensor  # [B] float32
    frequency: torch.Tensor  # [B] float32
    repetition: torch.Tensor  # [B] float32
    min_tokens: torch.Tensor  # [B] int64
    record: torch.Tensor  # [B] int64: 1 = this row's tokens are counted (it samples)
    banned: tuple[torch.Tensor, torch.Tensor] | None  # (row [M], token [M]) under min_tokens
    bias: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None  # (row, token, value) [Q]
    # rows given out this step: rows [I], prompt (row, token) pairs, output (row, token) pairs
    init: tuple[torch.Tensor, ...] | None
    use_counts: bool  # host: some request has a count-based penalty

    def apply(self, logits: torch.Tensor, counts: TokenCounts | None, req: torch.Tensor | None,
              out_index: torch.Tensor, extra: torch.Tensor | None = None,
              cols: torch.Tensor | None = None, vocab: int = 0) -> torch.Tensor:
        """logits [R, C] (any float dtype) -> processed float32 [R, C], a new tensor.
        req [R]: the batch row of each logits row (None: row r is batch row r); out_index
        [R]: the output index each row samples; extra [R, C] int32: drafted tokens on the
        row's path, counted on top of the table; cols [C]: the token id of each column of a
        draft vocabulary, within the target's `vocab` (None: C is the vocabulary)."""
        x = logits.to(torch.float32, copy=True)  # the raw logits stay (logprobs)
        b = self.rows.shape[0]

        def per_row(t: torch.Tensor) -> torch.Tensor:  # [B, ...] -> [R, ...]
            return t if req is None else t[req]

        def dense(index: tuple[torch.Tensor, torch.Tensor], values, dtype) -> torch.Tensor:
            out = torch.zeros(b, x.shape[1] if cols is None else vocab, dtype=dtype,
                              device=x.device)
            out.index_put_(index, values, accumulate=dtype != torch.bool)
            return per_row(out if cols is None else out[:, cols])

        if self.banned is not None:
            ban = dense(self.banned, torch.tensor(True, device=x.device), torch.bool)
            active = out_index < per_row(self.min_tokens)
            x.masked_fill_(ban & active[:, None], float("-inf"))
        if self.bias is not None:
            x += dense(self.bias[:2], self.bias[2], torch.float32)
        if self.use_counts:
            rows = per_row(self.rows)
            c = counts.table[rows] if cols is None else counts.table[rows[:, None], cols[None, :]]
            gen = c & COUNT_MASK
            if extra is not None:
                gen = gen + extra
            seen = (c >= PROMPT_BIT) | (gen > 0)
            rep = per_row(self.repetition)[:, None]
            x = torch.where(seen, torch.where(x > 0, x / rep, x * rep), x)
            x = x - per_row(self.frequency)[:, None] * gen - per_row(self.presence)[:, None] * (gen > 0)
        return x


def stage_penalties(st, reqs: list[Request], pad: int, record: list[bool],
                    fresh: list[bool]) -> None:
    """Stage the penalty inputs of `reqs` (then `pad` neutral rows) into the step's Stager.
    record[i]: request i's sample this step is a token of its output; fresh[i]: its row was
    given to it in this step (its counts are rebuilt)."""
    ban_rows, ban_toks, bias_rows, bias_toks, bias_vals = [], [], [], [], []
    init, prompt_rows, prompt_toks, out_rows, out_toks = [], [], [], [], []
    for i, (req, new) in enumerate(zip(reqs, fresh)):
        p = req.params
        if p.min_tokens > 0:
            stops = set(p.stop_token_ids or ()) | (set() if p.ignore_eos else set(req.eos_token_ids))
            ban_rows.extend([i] * len(stops))
            ban_toks.extend(sorted(stops))
        for tok, v in (p.logit_bias or {}).items():
            bias_rows.append(i)
            bias_toks.append(tok)
            bias_vals.append(v)
        if new and p.uses_counts:
            row = req.req_pool_index
            init.append(row)
            prompt_rows.extend([row] * len(req.prompt_token_ids))
            prompt_toks.extend(req.prompt_token_ids)
            out = [t for t in req.output_token_ids if t >= 0]  # no placeholders at admission
            out_rows.extend([row] * len(out))
            out_toks.extend(out)
    params = [r.params for r in reqs]
    st.add_ints("pen_rows", [r.req_pool_index for r in reqs] + [0] * pad)
    st.add_floats("pen_presence", [p.presence_penalty for p in params] + [0.0] * pad)
    st.add_floats("pen_frequency", [p.frequency_penalty for p in params] + [0.0] * pad)
    st.add_floats("pen_repetition", [p.repetition_penalty for p in params] + [1.0] * pad)
    st.add_ints("pen_min_tokens", [p.min_tokens for p in params] + [0] * pad)
    st.add_ints("pen_record", [int(r and p.uses_counts) for r, p in zip(record, params)]
                + [0] * pad)
    optional = {"ban": (ban_rows, ban_toks), "bias": (bias_rows, bias_toks, bias_vals),
                "init": (init, prompt_rows, prompt_toks, out_rows, out_toks)}
    for name, parts in optional.items():
        if parts[0]:
            for j, values in enumerate(parts):
                (st.add_floats if name == "bias" and j == 2 else st.add_ints)(
                    f"pen_{name}{j}", values)


def penalty_batch(d: dict[str, torch.Tensor], reqs: list[Request]) -> PenaltyBatch | None:
    """The PenaltyBatch over the staged tensors (None when nothing was staged)."""
    if "pen_rows" not in d:
        return None

    def parts(name: str, n: int) -> tuple[torch.Tensor, ...] | None:
        return tuple(d[f"pen_{name}{j}"] for j in range(n)) if f"pen_{name}0" in d else None

    return PenaltyBatch(
        rows=d["pen_rows"], presence=d["pen_presence"], frequency=d["pen_frequency"],
        repetition=d["pen_repetition"], min_tokens=d["pen_min_tokens"], record=d["pen_record"],
        banned=parts("ban", 2), bias=parts("bias", 3), init=parts("init", 5),
        use_counts=any(r.params.uses_counts for r in reqs),
    )


def path_counts(tokens: torch.Tensor, ancestors: torch.Tensor, depths: torch.Tensor,
                req: torch.Tensor, node: torch.Tensor, vocab: int) -> torch.Tensor:
    """[F, V] int32: for each verified node (request req[f], node index node[f]), how often
    each token occurs among the drafts on its path: its ancestors and itself, the root (the
    pending token, counted already) excluded. tokens, depths: [B, N]; ancestors [B, N, N]
    (ancestors-or-self)."""
    on_path = ancestors[req, node] & (depths[req] >= 1)  # [F, N]
    out = torch.zeros(req.shape[0], vocab, dtype=torch.int32, device=tokens.device)
    return out.scatter_add_(1, tokens[req], on_path.to(torch.int32))
