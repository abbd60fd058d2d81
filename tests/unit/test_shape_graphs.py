"""GraphCache over an emulation of CUDA graphs sharing one memory pool (eager_graphs.
SharedPoolGraphs: any replay may overwrite what another graph's capture allocated): a
graph's outputs hold until its own key replays again; buffers a body writes that outlive
the call come back as they are, not copied."""

from __future__ import annotations

import torch
from eager_graphs import SharedPoolGraphs

from gearshift.runner.graphs import owned_outputs
from gearshift.speculative.tree import DraftTree, chain_tree


def _tree(s):
    return chain_tree(s["root"], s["drafts"] + 1, torch.softmax(s["drafts"].float()[..., None]
                                                               .expand(-1, -1, 4), -1))


def test_outputs_survive_other_graphs_replays():
    g = SharedPoolGraphs()
    x = torch.arange(6).view(2, 3)
    tree = g.run(("expand",), _tree, {"root": torch.tensor([5, 6]), "drafts": x})
    want = [t.clone() for t in (tree.tokens, tree.parents, tree.depths, tree.draft_probs)]
    for step in range(3):  # other shapes captured after it, then replayed
        g.run(("verify", step), lambda s: (s["a"] * 2, None), {"a": torch.ones(3)})
        g.run(("verify", step), lambda s: (s["a"] * 2, None), {"a": torch.ones(3)})
    assert all(torch.equal(t, w) for t, w in
               zip((tree.tokens, tree.parents, tree.depths, tree.draft_probs), want))
    again = g.run(("expand",), _tree, {"root": torch.tensor([7, 8]), "drafts": x * 2})
    assert isinstance(again, DraftTree) and again.tokens is tree.tokens  # its own, reused
    assert again.tokens[:, 0].tolist() == [7, 8] and torch.equal(again.tokens[:, 1:], x * 2 + 1)


def test_shared_buffers_come_back_uncopied():
    g = SharedPoolGraphs()
    shared = torch.zeros(4)

    def body(s):  # the target's pattern: writes a buffer that outlives the call
        return shared.copy_(s["a"]), s["a"][:2], s["a"] + 1

    out = g.run(("target",), body, {"a": torch.arange(4.0)})
    assert out[0] is shared  # not copied (a [T, vocab] buffer per shape would not fit)
    assert out[1].untyped_storage().data_ptr() == g.entries[("target",)][1]["a"].data_ptr()
    assert g.in_pool[("target",)] == []  # nothing the pool could overwrite
    g.run(("other",), lambda s: s["b"] * 3, {"b": torch.ones(2)})
    assert out[2].tolist() == [1.0, 2.0, 3.0, 4.0]


def test_owned_outputs_keep_the_structure():
    buf = torch.ones(3)
    first = (buf, None, {"x": torch.zeros(2)}, [torch.zeros(1, dtype=torch.int64)])
    second = (buf, None, {"x": torch.zeros(2)}, [torch.zeros(1, dtype=torch.int64)])
    owned = owned_outputs(first, second)
    assert owned[0] is None and owned[1] is None
    assert owned[2]["x"].shape == (2,) and owned[2]["x"] is not second[2]["x"]
    assert owned[3][0].dtype == torch.int64
