"""The engine's tokenizer: the model directory's own or --tokenizer DIR, with the chat
template of --chat-template when given; text prompts to ids (encode_prompt); and chat
rendering for LLM.chat and /tokenize.

Data flow: Engine.__init__ -> load_engine_tokenizer(config, model dir) -> engine.tokenizer
(LLM, OutputProcessor, server); LLM.generate / the server's text prompts -> encode_prompt ->
ids; LLM.chat / POST /tokenize -> render_chat -> prompt text.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from gearshift.config import ConfigError, EngineConfig

log = logging.getLogger("gearshift.engine")

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


class ChatTemplateError(ValueError):
    """Messages that cannot become a prompt: no tokenizer, no template, or the template
    refused them; the message says which, `code` too (for the server's errors)."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


def load_tokenizer(path: Path):
    if not any((path / n).is_file() for n in TOKENIZER_FILES):
        log.warning("no tokenizer files in %s: only token-id prompts will work", path)
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def encode_prompt(tokenizer, text: str, add_special_tokens: bool = True) -> list[int]:
    """A text prompt's ids, the tokenizer's special tokens (BOS) added unless told not to;
    a text that already starts with the BOS token's text (an evaluation harness's, a
    rendered template's) does not get a second one, as lm-evaluation-harness's HF backend."""
    ids = list(tokenizer.encode(text, add_special_tokens=add_special_tokens))
    if doubled_bos(tokenizer, text, ids):
        return ids[1:]
    return ids


def doubled_bos(tokenizer, text: str, ids: list[int]) -> bool:
    """Whether `ids` (text's encoding) start with BOS twice: one added, one in the text."""
    bos, bos_id = getattr(tokenizer, "bos_token", None), getattr(tokenizer, "bos_token_id", None)
    return (bool(bos) and bos_id is not None and text.startswith(bos) and len(ids) >= 2
            and ids[0] == ids[1] == bos_id)


def load_engine_tokenizer(config: EngineConfig, model_path: Path | None):
    """The tokenizer of `config.tokenizer` (a directory) or of the model directory, with
    `config.chat_template` installed; ConfigError when either is given but unusable."""
    if config.tokenizer is not None:
        path = Path(config.tokenizer)
        if not path.is_dir() or not any((path / n).is_file() for n in TOKENIZER_FILES):
            raise ConfigError(f"tokenizer {config.tokenizer!r}: not a directory holding "
                              f"{' or '.join(TOKENIZER_FILES)}")
        tokenizer = load_tokenizer(path)
    else:
        tokenizer = load_tokenizer(model_path) if model_path is not None else None
    if config.chat_template is not None:
        if tokenizer is None:
            raise ConfigError("chat_template needs a tokenizer: this model has none (pass "
                              "--tokenizer DIR)")
        tokenizer.chat_template = read_chat_template(config.chat_template)
    return tokenizer


def read_chat_template(value: str) -> str:
    """A template file's text, or `value` itself when it is an inline Jinja template;
    checked to parse, so a broken template stops the start-up rather than every chat."""
    path = Path(value)
    try:
        is_file = path.is_file()
    except OSError:  # a long inline template is no valid path
        is_file = False
    if is_file:
        text = path.read_text()
    elif "{{" in value or "{%" in value:
        text = value
    else:
        raise ConfigError(f"chat template {value!r}: no such file, and not a Jinja template "
                          "(no '{{' or '{%')")
    import jinja2

    try:  # transformers' own environment: its extensions (loop controls, generation tags)
        from transformers.utils.chat_template_utils import _compile_jinja_template as compile_
    except ImportError:  # renamed: the first chat request reports a broken template instead
        return text
    try:
        compile_(text)
    except jinja2.TemplateSyntaxError as e:
        raise ConfigError(f"chat template: line {e.lineno}: {e.message}") from None
    return text


def render_chat(tokenizer, messages: list[dict], add_generation_prompt: bool = True,
                chat_template: str | None = None) -> str:
    """The prompt text of one conversation through `chat_template` or the tokenizer's."""
    if tokenizer is None:
        raise ChatTemplateError("this model has no tokenizer, so no chat template",
                                "no_tokenizer")
    if not (chat_template or getattr(tokenizer, "chat_template", None)):
        raise ChatTemplateError("this model's tokenizer has no chat template: pass one "
                                "(--chat-template, chat_template=...) or send plain prompts",
                                "no_chat_template")
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False,
                                             add_generation_prompt=add_generation_prompt,
                                             chat_template=chat_template)
    except Exception as e:  # jinja2 errors, e.g. the template's raise_exception
        raise ChatTemplateError(f"the chat template rejected the messages: {e}") from None


def eos_token_ids(cfg, path: Path | None, tokenizer) -> tuple[int, ...]:
    """The model's end-of-sequence ids: config.json, generation_config.json, the tokenizer."""
    ids = set(cfg.eos_token_ids)
    gen = path / "generation_config.json" if path else None
    if gen is not None and gen.is_file():
        eos = json.loads(gen.read_text()).get("eos_token_id")
        ids.update(eos if isinstance(eos, list) else [] if eos is None else [eos])
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return tuple(sorted(ids))
