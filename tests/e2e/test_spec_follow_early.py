"""The draft's follow-up over a VERIFY step's accepted tokens, laid out on the device and
launched before the host reads the step (speculative/follow_up.py), leaves the draft
exactly where the host-built follow-up after commit leaves it: the same proposals step by
step (which read the draft's KV and seed, and after plain steps its stored features), for
EAGLE-3 chains and trees, K mixed per request (plain steps between), sampled rows and the
prefix cache on or off, with drafts accepted (scripted: a random head accepts none). On
the graph stand-in, where the early path applies. Greedy text equals plain decoding
either way (test_spec_greedy.py)."""

from __future__ import annotations

import pytest
from checkpoints import make_perturbed_draft
from eagle3_checkpoints import make_eagle3_checkpoint
from follow_checks import follow_run, script_acceptance


@pytest.mark.parametrize("case", ["chain", "chain-no-cache", "tree", "random-k", "draft-model"])
def test_early_follow_up_leaves_the_draft_where_the_late_one_does(make_llm, tiny_llama_dir,
                                                                   tmp_path, monkeypatch, case):
    if case != "tree":  # a tree's path is recorded inside verification: its own acceptance
        script_acceptance(monkeypatch)
    if case == "draft-model":
        spec = dict(speculative_algorithm="draft",
                    draft_model=str(make_perturbed_draft(tiny_llama_dir, tmp_path / "d")))
    else:
        head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
        spec = dict(speculative_algorithm="eagle3", draft_model=str(head))
    spec.update(num_draft_tokens=3, spec_policy="random" if case == "random-k" else "always",
                tree_width=2 if case == "tree" else 1,
                enable_prefix_caching=case != "chain-no-cache")
    late = follow_run(make_llm, tiny_llama_dir, early=False, **spec)
    early = follow_run(make_llm, tiny_llama_dir, early=True, **spec)
    # the draft model extends eagerly (no graphed follow-up): the host lays it out
    assert (early[2] > 5) == (case != "draft-model")
    assert early[:2] == late[:2] and len(early[0]) > 5
    assert early[1][1] > 0 or case == "tree"
    assert early[3] == 0  # graphed steps carry no prefill chunk
