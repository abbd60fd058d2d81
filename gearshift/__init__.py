"""Gearshift: an LLM serving engine with load-adaptive speculative decoding."""

from gearshift.logs import configure_default as _configure_logging
from gearshift.request import RequestOutput, SamplingParams
from gearshift.structured.params import StructuredOutput

_configure_logging()

__all__ = ["LLM", "RequestOutput", "SamplingParams", "StructuredOutput"]
__version__ = "0.1.0"


def __getattr__(name: str):
    if name == "LLM":  # lazy: keeps `import gearshift` (and the CLI's --help) light
        from gearshift.llm import LLM

        return LLM
    raise AttributeError(name)
