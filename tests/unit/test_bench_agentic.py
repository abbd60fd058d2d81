"""`gearshift bench sweep --workload agentic | mixed-agentic`: edit-loop prompts (each turn
holds the earlier versions, asks for a rename, and starts the revised file), their layout
(blocks of conversations, turn by turn), the half-and-half mix, and a sweep that runs them
with suffix decoding and always-N policies on a tiny checkpoint."""

from __future__ import annotations

import json
import re

import pytest
from checkpoints import make_tiny_checkpoint

from gearshift.bench import agentic
from gearshift.cli import main

CODE = "\n".join(f"def step_{i}(value, count):\n    total = value * count + {i}\n"
                 f"    return total\n" for i in range(40))


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    from gearshift.models.default import default_target_dir

    return AutoTokenizer.from_pretrained(str(default_target_dir()))


def test_each_turn_holds_the_earlier_versions_and_asks_for_a_revision():
    import random

    turns = agentic.conversation(CODE[:300], random.Random(0), turns=3)
    assert len(turns) == 3
    for t, prompt in enumerate(turns, 1):
        asks = re.findall(r"# Revision (\d+): rename `(\w+)` to `(\w+)`", prompt)
        assert [int(a[0]) for a in asks] == list(range(1, t + 1))
        old, new = asks[-1][1], asks[-1][2]
        before, _, after = prompt.rpartition(f"# Revision {t}:")
        assert re.search(rf"\b{old}\b", before)  # the version to revise is in the prompt
        assert new in after.splitlines()[-1] or old not in after.splitlines()[-1]
        if t > 1:  # a turn extends the one before (its prompt, less the started file)
            prev = turns[t - 2]
            assert prompt.startswith(prev[:prev.rindex("\n# Revision")])
    assert turns[0].startswith(CODE[:300])


def test_agentic_prompts_lay_conversations_out_in_blocks_turn_by_turn(tok):
    ps = agentic.agentic_prompts(tok, [CODE], 24, 40, seed=3)
    assert len(ps) == 24
    texts = [tok.decode(p) for p in ps]
    turn = [len(re.findall(r"# Revision \d+:", t)) for t in texts]
    block = agentic.BLOCK * agentic.TURNS
    assert turn[:block] == [t for t in (1, 2, 3) for _ in range(agentic.BLOCK)]
    assert turn[block:2 * block] == turn[:block]
    # a conversation's turn 2 starts with its turn 1's text, up to that turn's request
    assert texts[agentic.BLOCK].startswith(texts[0][:texts[0].index("\n# Revision")])
    first = [len(p) for p in ps[:agentic.BLOCK]]
    assert min(first) >= 40 and max(first) < 200  # a window of about input_len tokens
    assert agentic.agentic_prompts(tok, [CODE], 24, 40, seed=3) == ps  # seeded
    assert agentic.agentic_prompts(tok, [CODE], 24, 40, seed=4) != ps


def test_mixed_agentic_interleaves_edit_loops_with_novel_prompts(tok):
    novel = [[7, 8, 9], [10, 11]]
    ps = agentic.workload_prompts("mixed-agentic", tok, [CODE], novel, 7, 40, seed=1)
    assert len(ps) == 7
    assert ps[1::2] == [novel[0], novel[1], novel[0]]
    assert ps[0::2] == agentic.agentic_prompts(tok, [CODE], 4, 40, seed=1)
    assert all("# Revision" in tok.decode(p) for p in ps[0::2])
    with pytest.raises(ValueError, match="no code window"):
        agentic.agentic_prompts(tok, ["x = 1\n"], 3, 40, seed=0)
    with pytest.raises(ValueError, match="unknown workload"):
        agentic.workload_prompts("uniform", tok, [CODE], novel, 2, 40, seed=0)
    assert agentic.source_texts()  # the held-out corpus, else the package's own files


def test_a_sweep_runs_the_agentic_workload_with_suffix_decoding(tmp_path, capsys, monkeypatch):
    """... and every point starts with an empty output cache: the policies run the same
    prompts, whose outputs the one before would otherwise draft."""
    from gearshift.speculative.proposers.suffix import SuffixProposer

    resets = []
    real = SuffixProposer.reset_cache
    monkeypatch.setattr(SuffixProposer, "reset_cache",
                        lambda self: resets.append(len(self.cache)) or real(self))
    target = make_tiny_checkpoint(tmp_path / "t", "llama")
    rc = main(["bench", "sweep", "--model", str(target), "--speculative-algorithm", "suffix",
               "--device", "cpu", "--workload", "mixed-agentic", "--concurrency", "2",
               "--rounds", "1", "--passes", "1", "--input-len", "24", "--output-len", "6",
               "--min-requests", "4", "--tree-topk", "1", "--settle", "0",
               "--policies", "off,always-12", "--output-json", str(tmp_path / "s.json"),
               "--output-png", str(tmp_path / "s.png")])
    assert rc == 0
    data = json.loads((tmp_path / "s.json").read_text())
    assert set(data["results"]) == {"off", "always-12"}
    assert all(r["output_tok_per_s"] > 0 for rows in data["results"].values() for r in rows)
    assert data["args"]["workload"] == "mixed-agentic"
    assert "always-12" in capsys.readouterr().out
    assert len(resets) == 2  # a point per policy (one concurrency, one pass)


def test_unknown_always_policies_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["bench", "sweep", "--policies", "always-0,off"])
    assert "always-N" in capsys.readouterr().err
