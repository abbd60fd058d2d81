"""The request workloads of `gearshift bench serve`, as conversations: each has a first
prompt and a number of turns; a later turn's prompt is the previous prompt, the model's
answer to it and a new user message (what a chat client resends).

    single         independent prompts of --input-len (one turn each)
    shared-prefix  one system prompt of --shared-prefix-len, then each request's own
                   --input-len (one turn each): the prefix cache serves the system prompt
    multi-turn     --turns turns per conversation, a shared system prompt first; each turn
                   adds --input-len new tokens of user message

Data flow: bench serve args -> conversations(args) -> Conversation.first / next -> prompts.
Multi-turn prompts are text (whatever --prompt-kind says): a turn resends the answer's text
and the server tokenises the whole history, as it would a chat's.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

WORDS = ("time gear shift speculative decoding model token batch server quick brown fox jumps "
         "over the lazy dog hello world").split()


def add_workload_args(p) -> None:
    p.add_argument("--workload", choices=["single", "shared-prefix", "multi-turn"],
                   default="single", help="request shapes (see gearshift/bench/workloads.py)")
    p.add_argument("--shared-prefix-len", type=int, default=512,
                   help="shared-prefix / multi-turn: tokens (words) of the shared system prompt")
    p.add_argument("--turns", type=int, default=4, help="multi-turn: turns per conversation "
                                                        "(--num-prompts conversations)")


@dataclass(slots=True)
class Conversation:
    prompt: str | list[int]
    turns: int
    messages: list[str]  # the user messages of turns 2..

    def first(self) -> str | list[int]:
        return self.prompt

    def next(self, prompt: str, answer: str, turn: int) -> str:
        return f"{prompt}{answer}\n{self.messages[turn]}"


def conversations(args) -> list[Conversation]:
    rng = random.Random(args.seed)
    n = args.num_prompts + args.warmup

    def text(words: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(words))

    def ids(count: int) -> list[int]:
        return [rng.randrange(10, 256) for _ in range(count)]

    own = (lambda: ids(args.input_len)) if args.prompt_kind == "ids" else \
        (lambda: text(args.input_len))
    if args.workload == "single":
        return [Conversation(own(), 1, []) for _ in range(n)]
    system = ids(args.shared_prefix_len) if args.prompt_kind == "ids" else \
        text(args.shared_prefix_len)
    if args.workload == "shared-prefix":
        return [Conversation(system + own() if isinstance(system, list) else f"{system}\n{own()}",
                             1, []) for _ in range(n)]
    turns = max(1, args.turns)
    system = text(args.shared_prefix_len)
    return [Conversation(f"{system}\n{text(args.input_len)}", turns,
                         [text(args.input_len) for _ in range(turns - 1)]) for _ in range(n)]
