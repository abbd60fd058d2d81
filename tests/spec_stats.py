"""Statistics shared by the sampling-distribution tests: the top-p nucleus as the sampler
cuts it, a chi-square goodness-of-fit p-value, and the exact law of five sampled tokens
from the HF logits of every continuation.

Data flow (tests only): HF logits of every continuation -> joint_law -> expected counts;
engine samples -> counts -> chi2_pvalue.
"""

from __future__ import annotations

import torch


def nucleus(probs: torch.Tensor, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """probs [..., V] float64 -> (top-p restricted and renormalised probs, [...] bool: rows
    whose cumulative masses come within 1e-5 of top_p, where float32 could decide otherwise)."""
    if top_p >= 1.0:
        return probs, torch.zeros(probs.shape[:-1], dtype=torch.bool)
    sorted_p, order = probs.sort(dim=-1, descending=True)
    before = sorted_p.cumsum(-1) - sorted_p
    keep = before < top_p
    keep[..., 0] = True
    out = torch.zeros_like(probs).scatter(-1, order, sorted_p * keep)
    return out / out.sum(-1, keepdim=True), ((before - top_p).abs() < 1e-5).any(-1)


def chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Goodness of fit of counts [C] to probs [C]; cells with expected count < 5 pooled (a
    pool still < 5 joins the smallest cell). Cells of probability 0 must be empty."""
    counts, probs = counts.double().flatten(), probs.double().flatten()
    assert counts[probs == 0].sum() == 0, "a token of target probability 0 was emitted"
    counts, probs = counts[probs > 0], probs[probs > 0]
    exp = probs * counts.sum()
    small = exp < 5
    obs_cells, exp_cells = counts[~small].clone(), exp[~small].clone()
    if small.any():
        if exp[small].sum() < 5:
            i = exp_cells.argmin()
            obs_cells[i] += counts[small].sum()
            exp_cells[i] += exp[small].sum()
        else:
            obs_cells = torch.cat([obs_cells, counts[small].sum()[None]])
            exp_cells = torch.cat([exp_cells, exp[small].sum()[None]])
    stat = ((obs_cells - exp_cells) ** 2 / exp_cells).sum()
    dof = torch.tensor((obs_cells.numel() - 1) / 2.0, dtype=torch.float64)
    return float(torch.special.gammaincc(dof, stat / 2))


def joint_law(target_logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Exact P(t1..t5) [V]*5 under temperature 1 and top_p."""
    p, close = nucleus(torch.softmax(target_logits, -1), top_p)  # [V, V, V, V, 5, V]
    law = p[0, 0, 0, 0, 0]  # [V]
    law = law[:, None] * p[:, 0, 0, 0, 1]
    law = law[..., None] * p[:, :, 0, 0, 2]
    law = law[..., None] * p[:, :, :, 0, 3]
    law = law[..., None] * p[:, :, :, :, 4]
    # contexts whose nucleus float32 might cut differently must be (almost) unreachable
    assert not close[0, 0, 0, 0, 0]
    edge = ((law.sum((1, 2, 3, 4)) * close[:, 0, 0, 0, 1]).sum()
            + (law.sum((2, 3, 4)) * close[:, :, 0, 0, 2]).sum()
            + (law.sum((3, 4)) * close[:, :, :, 0, 3]).sum()
            + (law.sum(4) * close[:, :, :, :, 4]).sum())
    assert edge < 1e-4, f"top_p is too close to a nucleus edge (reached with p={edge:.2g})"
    return law
