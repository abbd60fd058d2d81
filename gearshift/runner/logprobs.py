"""Log-probabilities of the target's RAW logits (log_softmax before temperature, penalties
and bias), only for the requests that ask for them: a step where none does builds no
LogprobPlan and computes nothing here.

    sampled tokens   plain step: the logits row each such request sampled from;
                     VERIFY: the rows of the accepted path's nodes (speculative/runner.py)
    prompt tokens    the logits at prompt position t score prompt token t + 1, so a prefill
                     chunk [p, p + n) yields the prompt logprobs of positions p + 1 .. p + n
                     (up to the prompt's end); such steps run eagerly (every chunk token's
                     logits), in slices so a long chunk never holds [n, vocab] at once

Results stay on the device until the step's tokens are read: `start_copy` queues their
copy to the host behind the sampled tokens, `read` turns them into TokenLogprob lists.

Data flow: BatchBuilder.prepare -> plan_logprobs -> SamplingBatch.logprobs -> ModelRunner.forward
/ SpecRunner.run fill `.sampled_out` / `.prompt_out` -> Engine: read (engine/logprob_outputs.py)
-> StepOutput.logprobs, Request.prompt_logprobs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gearshift.request import Request, TokenLogprob

SLICE_ROWS = 256  # prompt positions whose [rows, vocab] log-probabilities exist at once


@dataclass(slots=True)
class LogprobOut:
    """Device results for Q positions, then their host copies."""

    chosen: torch.Tensor  # [Q] float32: logprob of the token at each position
    ids: torch.Tensor  # [Q] int64: that token
    top_vals: torch.Tensor  # [Q, N] float32, best first
    top_ids: torch.Tensor  # [Q, N] int64

    def to_host(self) -> LogprobOut:
        """Copies queued behind the step's work (pinned on CUDA; read after its sync)."""
        return LogprobOut(*(_host_copy(t) for t in (self.chosen, self.ids, self.top_vals,
                                                    self.top_ids)))

    def entries(self) -> _Entries:
        """Host side: the results as Python lists, once (after the step's sync)."""
        return _Entries(self.chosen.tolist(), self.ids.tolist(), self.top_vals.tolist(),
                        self.top_ids.tolist())


@dataclass(slots=True)
class _Entries:
    chosen: list[float]
    ids: list[int]
    top_vals: list[list[float]]
    top_ids: list[list[int]]

    def take(self, start: int, count: int, n: int) -> list[TokenLogprob]:
        """TokenLogprobs of positions start..start+count-1 with n alternatives."""
        end = start + count
        return [TokenLogprob(i, c, list(zip(t[:n], v[:n]))) for i, c, t, v in zip(
            self.ids[start:end], self.chosen[start:end], self.top_ids[start:end],
            self.top_vals[start:end])]


def _host_copy(t: torch.Tensor) -> torch.Tensor:
    if not t.is_cuda:
        return t
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    return host.copy_(t, non_blocking=True)


def token_logprobs(logits: torch.Tensor, chosen: torch.Tensor, n: int) -> LogprobOut:
    """logits [Q, V] (raw, any float dtype), chosen [Q] int64 -> LogprobOut with n top."""
    lp = torch.log_softmax(logits.float(), dim=-1)  # [Q, V]
    top = lp.topk(min(n, lp.shape[-1]), dim=-1)
    return LogprobOut(lp.gather(1, chosen[:, None])[:, 0], chosen, top.values, top.indices)


def cat(outs: list[LogprobOut]) -> LogprobOut:
    return LogprobOut(*(torch.cat([getattr(o, f) for o in outs])
                        for f in ("chosen", "ids", "top_vals", "top_ids")))


@dataclass(slots=True)
class LogprobPlan:
    """Which positions of one step want log-probabilities (BatchBuilder writes the plan;
    the runner that runs the step writes the results)."""

    top_n: int  # the most alternatives any request of the step asks for
    sampled: list[int]  # batch indices of requests whose sampled tokens want logprobs
    sampled_dev: torch.Tensor | None  # the same on the device
    # prompt positions: (batch index, count) per request in batch order, and on the device
    # the logits row (token index in the forward) and the scored prompt token of each
    prompt_spans: list[tuple[int, int]]
    prompt_rows: torch.Tensor | None  # [P] int64
    prompt_ids: torch.Tensor | None  # [P] int64
    sampled_out: LogprobOut | None = None  # set by the runner: per sampled request, D + 1
    prompt_out: LogprobOut | None = None  # set by the runner (plain steps)
    per_request: int = 1  # set by the runner: sampled positions per request (VERIFY: D + 1)

    def start_copy(self) -> None:
        """Queue the results' host copies (before the step's tokens are read)."""
        if self.sampled_out is not None:
            self.sampled_out = self.sampled_out.to_host()
        if self.prompt_out is not None:
            self.prompt_out = self.prompt_out.to_host()

    def read(self, reqs: list[Request]) -> dict[int, list[TokenLogprob]]:
        """After the step's sync: per batch index, the sampled positions' TokenLogprobs
        (VERIFY: the accepted path's D + 1, the caller keeps what it emitted); prompt
        positions are appended to their requests' `prompt_logprobs`."""
        out = {}
        if self.sampled_out is not None:
            k, got = self.per_request, self.sampled_out.entries()
            for j, i in enumerate(self.sampled):
                out[i] = got.take(j * k, k, reqs[i].params.logprobs)
        start, got = 0, self.prompt_out.entries() if self.prompt_spans else None
        for i, count in self.prompt_spans:
            req = reqs[i]
            if req.prompt_logprobs is None:
                req.prompt_logprobs = []
            req.prompt_logprobs += got.take(start, count, req.params.prompt_logprobs)
            start += count
        return out


def plan_logprobs(st, reqs: list[Request], prefix: list[int], extend: list[int],
                  samples: list[bool]) -> tuple[int, list[int], list[tuple[int, int]]]:
    """Stage the logprob positions of a step where some request asks for logprobs. Prompt
    positions are marked planned on their requests (each is computed once, preemption
    included). -> (top_n, sampled batch indices, prompt spans)."""
    sampled = [i for i, (r, s) in enumerate(zip(reqs, samples))
               if s and r.params.logprobs is not None]
    rows, ids, spans, start, top_n = [], [], [], 0, 0
    for i, (req, p, n) in enumerate(zip(reqs, prefix, extend)):
        if req.wants_prompt_logprobs(p, n):
            first = max(p, req.prompt_logprobs_planned)
            last = min(p + n, len(req.prompt_token_ids) - 1)  # positions first..last-1
            rows.extend(range(start + first - p, start + last - p))
            ids.extend(req.prompt_token_ids[first + 1:last + 1])
            spans.append((i, last - first))
            req.prompt_logprobs_planned = last
            top_n = max(top_n, req.params.prompt_logprobs)
        start += n
    top_n = max([top_n] + [reqs[i].params.logprobs for i in sampled])
    if sampled:
        st.add_ints("lp_sampled", sampled)
    if spans:
        st.add_ints("lp_prompt_rows", rows)
        st.add_ints("lp_prompt_ids", ids)
    return top_n, sampled, spans


def logprob_plan(d: dict[str, torch.Tensor], planned) -> LogprobPlan | None:
    if planned is None:
        return None
    top_n, sampled, spans = planned
    return LogprobPlan(top_n, sampled, d.get("lp_sampled"), spans, d.get("lp_prompt_rows"),
                       d.get("lp_prompt_ids"))


def prompt_logprobs(model, hidden: torch.Tensor, plan: LogprobPlan) -> LogprobOut:
    """Prompt positions' logprobs from the forward's hidden states [T, H], in slices."""
    outs = []
    for s in range(0, plan.prompt_rows.shape[0], SLICE_ROWS):
        rows = plan.prompt_rows[s:s + SLICE_ROWS]
        logits = model.compute_logits(hidden[rows])
        outs.append(token_logprobs(logits, plan.prompt_ids[s:s + SLICE_ROWS], plan.top_n))
    return cat(outs)
