"""Speculation policies: how many draft tokens each running request gets this step."""

from __future__ import annotations

from gearshift.config import SPEC_POLICIES, ConfigError, EngineConfig
from gearshift.policy.base import Policy, PolicyView

__all__ = ["Policy", "PolicyView", "create_policy"]


def create_policy(config: EngineConfig, cost_model=None, pad=lambda bs: bs,
                  verify_tokens=None) -> Policy:
    """`cost_model` is a zero-argument callable (profiling runs only for `goodput`);
    `verify_tokens(requests, tokens)`: what a VERIFY pass mixing K runs over. A hybrid
    engine ("eagle3+suffix") plans with the named policy for its model proposer inside
    the HybridPolicy that chooses a proposer per request (policy/hybrid.py)."""
    policy = _single(config, cost_model, pad, verify_tokens)
    if config.hybrid and policy.drafts:  # a proposer per request: priced beside the model
        from gearshift.policy.hybrid import HybridPolicy

        return HybridPolicy(policy, config.model_algorithm)
    return policy


def _single(config: EngineConfig, cost_model, pad, verify_tokens) -> Policy:
    from gearshift.policy.goodput import GoodputPolicy
    from gearshift.policy.randomized import RandomPolicy
    from gearshift.policy.static import AlwaysPolicy, OffPolicy
    from gearshift.policy.threshold import SGLANG_LIKE, ThresholdPolicy

    name = config.spec_policy
    num_draft_tokens = config.num_draft_tokens
    if name == "off":
        return OffPolicy()
    if name == "always":
        return AlwaysPolicy(num_draft_tokens)
    if name == "random":
        return RandomPolicy(num_draft_tokens, seed=config.seed)
    if name == "threshold":
        return ThresholdPolicy(SGLANG_LIKE, num_draft_tokens)
    if name in ("goodput", "goodput-request"):  # one K for the batch, or K per request
        return GoodputPolicy(cost_model(), num_draft_tokens, pad=pad,
                             per_request=name == "goodput-request", verify_tokens=verify_tokens)
    raise ConfigError(f"unknown spec_policy {name!r} ({', '.join(SPEC_POLICIES)})")
