"""The request workloads of `gearshift bench serve`, as conversations: each has a first
request and a number of turns; a later turn resends the previous prompt, the model's
answer and a new user message (what a chat client does).

    --dataset      where prompts come from: random-ids (token ids, exact lengths),
                   random-words, corpus (windows of the held-out corpus: real text, real
                   speculation acceptance), jsonl:PATH (one {"prompt": ...} or OpenAI chat
                   {"messages": [...]} per line, as vLLM's custom datasets)
    --workload     single (independent requests), shared-prefix (one system prompt of
                   --shared-prefix-len before each request's own text), multi-turn
                   (--turns turns per conversation after a shared system prompt)

Data flow: bench serve args -> conversations(args) -> Conversation.first / next -> the
bodies bench serve posts (`completion` prompts or `chat` messages).
"""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

WORDS = ("time gear shift speculative decoding model token batch server quick brown fox jumps "
         "over the lazy dog hello world").split()
CHARS_PER_TOKEN = 4  # corpus windows: characters per requested token, roughly


def add_workload_args(p) -> None:
    p.add_argument("--dataset", default="random-ids",
                   help="random-ids | random-words | corpus | jsonl:PATH")
    p.add_argument("--workload", choices=["single", "shared-prefix", "multi-turn"],
                   default="single", help="request shapes (see gearshift/bench/workloads.py)")
    p.add_argument("--shared-prefix-len", type=int, default=512,
                   help="shared-prefix / multi-turn: tokens (words) of the shared system prompt")
    p.add_argument("--turns", type=int, default=4, help="multi-turn: turns per conversation "
                                                        "(--num-prompts conversations)")


@dataclass(slots=True)
class Conversation:
    prompt: str | list[int] | None = None  # a completion prompt, or
    messages: list[dict] | None = None  # chat messages (jsonl datasets)
    turns: int = 1
    followups: list[str] = field(default_factory=list)  # user messages of turns 2..

    @property
    def chat(self) -> bool:
        return self.messages is not None

    def first(self) -> str | list[int] | list[dict]:
        return self.messages if self.chat else self.prompt

    def next(self, request, answer: str, turn: int):
        if self.chat:
            return [*request, {"role": "assistant", "content": answer},
                    {"role": "user", "content": self.followups[turn]}]
        return f"{request}{answer}\n{self.followups[turn]}"


def check_dataset(name: str) -> None:
    if name in ("random-ids", "random-words", "corpus"):
        return
    if not name.startswith("jsonl:"):
        raise ValueError(f"--dataset must be random-ids, random-words, corpus or jsonl:PATH, "
                         f"not {name!r}")
    if not Path(name[len("jsonl:"):]).is_file():
        raise ValueError(f"--dataset {name}: no such file")


def conversations(args) -> list[Conversation]:
    check_dataset(args.dataset)
    rng = random.Random(args.seed)
    n = args.num_prompts + args.warmup
    if args.dataset.startswith("jsonl:"):
        return _jsonl(args.dataset[len("jsonl:"):], n)
    texts = _corpus_windows(args.input_len, rng) if args.dataset == "corpus" else None
    drawn = itertools.count()

    def words(count: int) -> str:
        if texts:  # the shuffled windows in turn: drawn at random, a small corpus repeats
            # prompts, and each repeat is a prefix-cache hit the closed loop never gets
            return texts[next(drawn) % len(texts)][: count * CHARS_PER_TOKEN]
        return " ".join(rng.choice(WORDS) for _ in range(count))

    def own() -> str | list[int]:
        if args.dataset == "random-ids" and args.workload != "multi-turn":
            return [rng.randrange(10, 256) for _ in range(args.input_len)]
        return words(args.input_len)

    if args.workload == "single":
        return [Conversation(prompt=own()) for _ in range(n)]
    if args.workload == "shared-prefix":
        if args.dataset == "random-ids":
            system = [rng.randrange(10, 256) for _ in range(args.shared_prefix_len)]
            return [Conversation(prompt=system + own()) for _ in range(n)]
        system = words(args.shared_prefix_len)
        return [Conversation(prompt=f"{system}\n{own()}") for _ in range(n)]
    # multi-turn prompts are text: a turn resends the answer's text and the server tokenises
    # the whole history, as it would a chat's
    system, turns = words(args.shared_prefix_len), max(1, args.turns)
    return [Conversation(prompt=f"{system}\n{own()}", turns=turns,
                         followups=[words(args.input_len) for _ in range(turns - 1)])
            for _ in range(n)]


def _corpus_windows(input_len: int, rng: random.Random) -> list[str]:
    from gearshift.train.corpus import load_texts

    size = input_len * CHARS_PER_TOKEN
    docs = [t for t in load_texts("heldout") if len(t) > size]
    if not docs:
        raise ValueError("the held-out corpus has no document long enough")
    out = [d[i:i + size] for d in docs for i in range(0, len(d) - size, size)]
    rng.shuffle(out)
    return out


def _jsonl(path: str, n: int) -> list[Conversation]:
    out = []
    for i, line in enumerate(Path(path).read_text().splitlines()):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{i + 1}: not JSON ({e})") from None
        if isinstance(row.get("prompt"), str | list):
            out.append(Conversation(prompt=row["prompt"]))
        elif isinstance(row.get("messages"), list):
            out.append(Conversation(messages=row["messages"]))
        else:
            raise ValueError(f"{path}:{i + 1}: expected a \"prompt\" or \"messages\" field")
    if not out:
        raise ValueError(f"{path}: no requests")
    return [out[i % len(out)] for i in range(n)]
