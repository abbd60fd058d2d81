"""`gearshift bench sweep --workload agentic | mixed-agentic`: traffic that re-emits its input,
where suffix decoding drafts long spans, and that traffic half and half with novel text.

    agentic        multi-turn edit loops. A conversation starts from a code window v0 of
                   about input_len tokens; turn t asks for a revision (rename one
                   identifier) and its prompt holds every earlier version and request,
                   then the revised file's first line: the answer copies most of v(t-1)

                   turn 1:  v0 | "# Revision 1: rename a to b ..." | first line of v1
                   turn 2:  v0 | rev 1 | v1 | "# Revision 2: ..."  | first line of v2
                   ...      (each turn's prompt starts with the one before: prefix hits)

    mixed-agentic  prompt i is agentic for even i, a novel prompt (the uniform workload's
                   held-out corpus window) for odd i, so every stretch of the closed loop
                   holds both

Conversations are laid out in blocks of BLOCK, turn by turn (the block's turn 1s, then its
turn 2s, ...): a turn usually arrives after the one it extends has finished, as in an
agent's loop, and any BLOCK x TURNS consecutive prompts hold every turn.

Data flow: sweep.run -> workload_prompts(tokenizer, texts, novel, n, input_len, seed) ->
the uniform sweep's closed loops (sweep.py).
"""

from __future__ import annotations

import logging
import random
import re

log = logging.getLogger("gearshift.bench")

TURNS = 3  # revisions per conversation
BLOCK = 4  # conversations laid out together
IDENT = re.compile(r"\b[a-z_][a-z0-9_]{2,}\b")
KEYWORDS = frozenset("and as assert async await break class continue def del elif else except "
                     "false finally for from global if import in is lambda none nonlocal not "
                     "or pass raise return self true try while with yield".split())


def code_windows(tokenizer, texts: list[str], input_len: int) -> list[str]:
    """Whole-line windows of about input_len tokens from the texts, in order."""
    out = []
    for text in texts:
        lines, cur, n = text.splitlines(keepends=True), [], 0
        for line in lines:
            cur.append(line)
            n += len(tokenizer.encode(line))
            if n >= input_len:
                if any(IDENT.search(x) for x in cur):
                    out.append("".join(cur))
                cur, n = [], 0
    return out


def revise(code: str, rng: random.Random, turn: int) -> tuple[str, str]:
    """-> (the code with one identifier renamed everywhere, the request asking for it)."""
    names = sorted({m for m in IDENT.findall(code) if m not in KEYWORDS})
    if not names:
        return code, f"# Revision {turn}: no change. The whole file again:\n"
    old = rng.choice(names)
    new = f"{old}_{rng.choice(('new', 'v2', 'fixed', 'renamed', 'tmp'))}{turn}"
    return (re.sub(rf"\b{re.escape(old)}\b", new, code),
            f"\n# Revision {turn}: rename `{old}` to `{new}`. The whole file again:\n")


def conversation(code: str, rng: random.Random, turns: int = TURNS) -> list[str]:
    """The prompt text of each turn of one edit loop starting from `code`."""
    history, prompts, version = "", [], code
    for t in range(1, turns + 1):
        revised, ask = revise(version, rng, t)
        first = revised.splitlines(keepends=True)[0]
        prompts.append(history + version + ask + first)
        history += version + ask
        version = revised
    return prompts


def agentic_prompts(tokenizer, texts: list[str], n: int, input_len: int, seed: int,
                    turns: int = TURNS) -> list[list[int]]:
    """n prompts of edit loops: blocks of BLOCK conversations, turn by turn."""
    rng = random.Random(seed)
    windows = code_windows(tokenizer, texts, input_len)
    if not windows:
        raise ValueError("agentic workload: no code window of input_len tokens in the texts")
    convs = -(-n // turns)
    start = rng.randrange(len(windows))
    loops = [conversation(windows[(start + c) % len(windows)], rng, turns) for c in range(convs)]
    order = [(c, t) for b in range(0, convs, BLOCK) for t in range(turns)
             for c in range(b, min(b + BLOCK, convs))]
    return [tokenizer.encode(loops[c][t]) for c, t in order[:n]]


def workload_prompts(name: str, tokenizer, texts: list[str], novel: list[list[int]], n: int,
                     input_len: int, seed: int) -> list[list[int]]:
    """`agentic`: n edit-loop prompts; `mixed-agentic`: agentic and `novel` interleaved."""
    if name == "agentic":
        return agentic_prompts(tokenizer, texts, n, input_len, seed)
    if name != "mixed-agentic":
        raise ValueError(f"unknown workload {name!r}")
    agentic = agentic_prompts(tokenizer, texts, -(-n // 2), input_len, seed)
    return [agentic[i // 2] if i % 2 == 0 else novel[i // 2 % len(novel)] for i in range(n)]


def source_texts() -> list[str]:
    """The held-out corpus (the draft's domain), else this package's own sources."""
    try:
        from gearshift.train.corpus import load_texts

        texts = load_texts("heldout")
        if texts:
            return texts
    except Exception as e:  # noqa: BLE001 (no corpus here: the package's files are code too)
        log.warning("held-out corpus unavailable (%s): agentic prompts from gearshift's own "
                    "sources", e)
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    return [p.read_text() for p in sorted(root.rglob("*.py"))]
