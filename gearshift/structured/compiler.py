"""StructuredOutput -> a compiled xgrammar grammar over the model's tokenizer and vocabulary,
and the per-request grammar (matcher.py) that masks its tokens.

xgrammar (the library vLLM and SGLang use) is imported on first use: an engine serving no
structured request never loads it, and where it is not installed a structured request is
refused with a message saying so. Compiled grammars are cached by xgrammar (keyed by the
constraint's text), so the server compiles a request's grammar off the event loop first
(validating it) and the engine thread's compile for the same request is a cache hit.

Data flow: server (Offload thread): GrammarCompiler.compile (errors -> 400) ->
Engine.add_request: GrammarCompiler.grammar -> Request.grammar.
Thread-safe: the server's worker threads and the engine thread share one compiler.
"""

from __future__ import annotations

import json
import re
import threading

from gearshift.structured.matcher import RequestGrammar
from gearshift.structured.params import StructuredOutput, StructuredOutputError

CACHE_LIMIT_BYTES = 256 << 20  # compiled grammars kept (user schemas are unbounded in number)
# xgrammar's C++ errors start with "[hh:mm:ss] /path/file.cc:123: "
_LOCATION = re.compile(r"^\[[\d:]+\] \S+:\d+: ")


def import_xgrammar():
    try:
        import xgrammar
    except ImportError as e:
        raise StructuredOutputError(
            None, "structured output needs the xgrammar package, which is not installed "
            f"here ({e}): pip install xgrammar") from None
    return xgrammar


class GrammarCompiler:
    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: tuple[int, ...]) -> None:
        self.tokenizer = tokenizer  # a Hugging Face tokenizer (None: the model has none)
        self.vocab_size = vocab_size  # the model's (its lm_head rows), >= the tokenizer's
        self.stop_token_ids = stop_token_ids  # the engine's EOS ids: allowed where the grammar ends
        self._lock = threading.Lock()
        self._compiler = None  # xgrammar.GrammarCompiler, built on first use

    def _xgr(self):
        with self._lock:
            if self._compiler is None:
                if self.tokenizer is None:
                    raise StructuredOutputError(
                        None, "structured output needs the model's tokenizer, and this model has none")
                xgr = import_xgrammar()
                info = xgr.TokenizerInfo.from_huggingface(
                    self.tokenizer, vocab_size=self.vocab_size,
                    stop_token_ids=list(self.stop_token_ids))
                self._compiler = xgr.GrammarCompiler(info, cache_limit_bytes=CACHE_LIMIT_BYTES)
            return self._compiler

    def compile(self, so: StructuredOutput):
        """-> xgrammar.CompiledGrammar; StructuredOutputError (naming the field) when the
        schema / regex / grammar is invalid or uses what xgrammar does not support."""
        compiler = self._xgr()
        kind = so.kind
        try:
            if kind == "json":
                return compiler.compile_json_schema(json.dumps(so.json),
                                                    any_whitespace=False)
            if kind == "json_object":
                return compiler.compile_json_schema('{"type": "object"}', any_whitespace=False)
            if kind == "regex":
                return compiler.compile_regex(so.regex)
            if kind == "grammar":
                return compiler.compile_grammar(so.grammar)
            return compiler.compile_grammar(choice_grammar(so.choice))
        except Exception as e:  # noqa: BLE001 - xgrammar raises RuntimeError for bad input
            what = {"json": "JSON schema", "regex": "regex", "grammar": "grammar",
                    "choice": "choice", "json_object": "JSON object grammar"}[kind]
            message = _LOCATION.sub("", str(e).strip()) or type(e).__name__
            raise StructuredOutputError(kind, f"invalid {what}: {message}") from None

    def grammar(self, so: StructuredOutput) -> RequestGrammar:
        """A fresh per-request grammar at the start of the output."""
        compiled = self.compile(so)
        return RequestGrammar(self._xgr_module().GrammarMatcher(compiled), self.vocab_size)

    @staticmethod
    def _xgr_module():
        return import_xgrammar()


def choice_grammar(choices: tuple[str, ...]) -> str:
    """An EBNF grammar matching exactly one of `choices` (JSON string escapes are also
    EBNF's)."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)
