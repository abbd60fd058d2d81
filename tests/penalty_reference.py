"""Plain-Python references of the sampling penalties, for tests: one logits row by the
rules (min_tokens, logit_bias, then repetition as HF, frequency and presence as OpenAI),
and greedy decoding with them on the HF oracle, one full forward per token.

Data flow (tests only): HF model -> logits -> penalised() -> argmax <-> the engine's tokens.
"""

from __future__ import annotations

import torch

from gearshift.request import SamplingParams


def penalised(logits: list[float], prompt: list[int], generated: list[int], p: SamplingParams,
              eos: tuple[int, ...]) -> list[float]:
    """One row of raw logits -> the row the sampler draws from (before temperature)."""
    x = list(logits)
    if len(generated) < p.min_tokens:
        for t in set(p.stop_token_ids or ()) | (set() if p.ignore_eos else set(eos)):
            x[t] = float("-inf")
    for t, b in (p.logit_bias or {}).items():
        x[t] += b
    seen = set(prompt) | set(generated)
    for t in range(len(x)):
        if t in seen:
            x[t] = x[t] / p.repetition_penalty if x[t] > 0 else x[t] * p.repetition_penalty
        n = generated.count(t)
        x[t] -= p.frequency_penalty * n + p.presence_penalty * (n > 0)
    return x


@torch.no_grad()
def penalised_greedy(model, prompt: list[int], p: SamplingParams, eos: tuple[int, ...]
                     ) -> list[int]:
    """Greedy tokens under p's penalties, stopping as the engine does (EOS unless
    ignore_eos, stop ids, max_tokens)."""
    out: list[int] = []
    while len(out) < p.max_tokens:
        logits = model(torch.tensor([prompt + out])).logits[0, -1].tolist()
        row = penalised(logits, prompt, out, p, eos)
        tok = max(range(len(row)), key=row.__getitem__)
        out.append(tok)
        if (tok in eos and not p.ignore_eos) or tok in (p.stop_token_ids or ()):
            break
    return out
