"""Offline Python API: `LLM(model).generate(prompts, SamplingParams(...))` and
`LLM(model).chat(messages)`.

Data flow: LLM.generate -> tokenizer -> Engine.add_request -> Engine.step() loop ->
OutputProcessor (detokenise, stop strings) -> list[RequestOutput] in prompt order;
LLM.chat -> the chat template (tokenizer.py) -> token ids -> LLM.generate.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from tqdm.auto import tqdm

from gearshift.config import ConfigError, EngineConfig, rename_options
from gearshift.distributed import create_engine
from gearshift.engine.engine import PromptError
from gearshift.frontend.output_processor import OutputProcessor
from gearshift.request import RequestOutput, SamplingParams
from gearshift.tokenizer import encode_prompt, read_chat_template, render_chat


def _text_message(message: dict) -> dict:
    """Content given as OpenAI parts ([{"type": "text", "text": ...}]) joined into one
    string, as templates expect."""
    content = message.get("content")
    if isinstance(content, list):
        message = {**message, "content": "".join(
            p["text"] for p in content if isinstance(p, dict) and p.get("type") == "text")}
    return message


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def build_engine_config(model: str | None, *, device: str | None = None, dtype: str | None = None,
                        max_num_seqs: int | None = None, kv_cache_tokens: int | None = None,
                        seed: int = 0, **options) -> EngineConfig:
    """Fill in defaults: the embedded default model, the best device, its natural dtype
    (float32 on CPU, bfloat16 on GPU) and its attention backend. The embedded model ships
    its EAGLE-3 head: it speculates unless `speculative_algorithm` is given (None or
    "none": off); another model speculates only with a draft named."""
    from gearshift.models.default import default_target_dir, is_default_target

    options = rename_options(options)  # old option names warn, naming the new ones
    if model is None:
        model = str(default_target_dir())
    if "speculative_algorithm" not in options and not options.get("draft_model") \
            and is_default_target(model):
        options["speculative_algorithm"] = "eagle3"
    if options.get("speculative_algorithm") == "none":
        options["speculative_algorithm"] = None
    device = device or default_device()
    on_gpu = device.startswith("cuda")
    dtype = dtype or ("bfloat16" if on_gpu else "float32")
    options.setdefault("attention_backend", "triton" if on_gpu else "torch")
    known = set(EngineConfig.__dataclass_fields__)
    unknown = sorted(set(options) - known)
    if unknown:
        raise ConfigError(f"unknown engine option(s) {unknown}; known: {sorted(known - {'model'})}")
    return EngineConfig(model=model, device=device, dtype=dtype,
                        max_num_seqs=64 if max_num_seqs is None else max_num_seqs,
                        kv_cache_tokens=kv_cache_tokens, seed=seed, **options)


class LLM:
    def __init__(self, model: str | None = None, *, device: str | None = None,
                 dtype: str | None = None, max_num_seqs: int | None = None,
                 kv_cache_tokens: int | None = None, seed: int = 0, **engine_options) -> None:
        config = build_engine_config(model, device=device, dtype=dtype, max_num_seqs=max_num_seqs,
                                     kv_cache_tokens=kv_cache_tokens, seed=seed, **engine_options)
        self.engine = create_engine(config)  # tensor_parallel_size > 1: rank 0's engine
        self.tokenizer = self.engine.tokenizer
        self._ids = itertools.count()

    def generate(self, prompts: str | list[int] | Sequence[str | list[int]],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # one prompt (text or token ids)
        prompts = list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        params = ([sampling_params] * len(prompts) if isinstance(sampling_params, SamplingParams)
                  else list(sampling_params))
        if len(params) != len(prompts):
            raise ValueError(f"got {len(params)} sampling params for {len(prompts)} prompts")
        proc = OutputProcessor(self.tokenizer)
        order: list[str] = []
        for prompt, p in zip(prompts, params):
            ids = self._encode(prompt)
            rid = f"gen-{next(self._ids)}"
            proc.add(rid, ids, p, seed=self.engine.add_request(rid, ids, p))
            order.append(rid)
        results: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(order), desc="Processed prompts", unit="prompt", disable=not use_tqdm,
                   dynamic_ncols=True)
        try:
            while len(results) < len(order):
                for out in self.engine.step():
                    delta = proc.process(out)
                    if delta.stop_hit:
                        self.engine.abort_request(out.request_id, "stop")
                    if delta.finished:
                        results[out.request_id] = proc.final(out.request_id)
                        bar.update(1)
        finally:
            bar.close()
            for rid in order:  # on error (e.g. KeyboardInterrupt) leave nothing running
                if rid not in results:
                    self.engine.abort_request(rid)
        return [results[rid] for rid in order]

    def chat(self, messages: Sequence[dict] | Sequence[Sequence[dict]],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None = None, *,
             use_tqdm: bool = True, chat_template: str | None = None,
             add_generation_prompt: bool = True) -> list[RequestOutput]:
        """Reply to one conversation (a list of {"role", "content"} messages) or to each of
        a list of them, through the tokenizer's chat template (or `chat_template`, inline
        Jinja or a file); one RequestOutput per conversation."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [self._chat_ids(list(c), chat_template, add_generation_prompt)
                   for c in conversations]
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def _chat_ids(self, messages: list[dict], chat_template: str | None,
                  add_generation_prompt: bool) -> list[int]:
        template = read_chat_template(chat_template) if chat_template is not None else None
        text = render_chat(self.tokenizer, [_text_message(m) for m in messages],
                           add_generation_prompt, template)
        return self.tokenizer.encode(text, add_special_tokens=False)  # the template wrote them

    def _encode(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise PromptError("this model directory has no tokenizer: pass token-id prompts")
            return encode_prompt(self.tokenizer, prompt)
        return list(prompt)

    def memory_stats(self) -> dict:
        return self.engine.memory_stats()

    def reset_prefix_cache(self) -> int:
        """Drop every cached prefix that no running request holds; -> KV slots freed."""
        return self.engine.reset_prefix_cache()

    def stats(self) -> dict:
        return self.engine.stats()

    def spec_stats(self) -> dict:
        """Speculation counters: steps by K, proposed / accepted tokens, acceptance rate,
        accepted-length histogram, and the goodput controller's last prediction."""
        return self.engine.spec_stats()
