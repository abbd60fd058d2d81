"""Proposers: who drafts the tokens a VERIFY step checks. `eagle3` (a one-layer head fed
with target features), `draft` (a separate small model), `ngram` (prompt lookup, no model),
`suffix` (suffix decoding, no model: suffix*.py), and a model proposer beside suffix
decoding (`eagle3+suffix`, `draft+suffix`: hybrid.py, a proposer per request); `expand.py`
grows chains and trees for the model-based two. The contract is base.py.

Data flow: EngineConfig.speculative_algorithm -> create_proposer -> SpecRunner.
"""

from __future__ import annotations

from gearshift.config import EngineConfig
from gearshift.speculative.proposers.base import Proposer


def create_proposer(config: EngineConfig, runner) -> Proposer:
    if config.hybrid:
        from gearshift.speculative.proposers.hybrid import HybridProposer
        from gearshift.speculative.proposers.suffix import SuffixProposer

        model = _single(config, runner, config.model_algorithm)
        proposer = HybridProposer(model, config.model_algorithm,
                                  SuffixProposer(config.suffix_cache_tokens))
        proposer.runner = runner
        return proposer
    return _single(config, runner, config.speculative_algorithm)


def _single(config: EngineConfig, runner, algo: str) -> Proposer:
    if algo == "ngram":
        from gearshift.speculative.proposers.ngram import NgramProposer

        proposer = NgramProposer(config.ngram_min, config.ngram_max)
    elif algo == "suffix":
        from gearshift.speculative.proposers.suffix import SuffixProposer

        proposer = SuffixProposer(config.suffix_cache_tokens)
    elif algo == "draft":
        from gearshift.speculative.proposers.draft_model import DraftModelProposer

        proposer = DraftModelProposer(config, runner.model.config, runner.kv,
                                      runner.max_positions)
    else:
        from gearshift.models.default import default_head_dir
        from gearshift.speculative.proposers.eagle3 import Eagle3Proposer

        head = config.draft_model or str(default_head_dir())
        proposer = Eagle3Proposer(config, head, runner.model.config, runner.model, runner.kv,
                                  runner.max_positions, config.max_num_seqs)
    proposer.runner = runner  # its draft steps replay CUDA graphs when the runner has them
    return proposer
