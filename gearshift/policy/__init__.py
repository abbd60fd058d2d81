"""Speculation policies: how many draft tokens each running request gets this step."""

from __future__ import annotations

from gearshift.config import ConfigError, EngineConfig
from gearshift.policy.base import Policy, PolicyView

__all__ = ["Policy", "PolicyView", "create_policy"]


def create_policy(config: EngineConfig) -> Policy:
    from gearshift.policy.randomized import RandomPolicy
    from gearshift.policy.static import AlwaysPolicy, OffPolicy

    name = config.spec_policy
    k = config.num_draft_tokens
    if name == "off":
        return OffPolicy()
    if name == "always":
        return AlwaysPolicy(k)
    if name == "random":
        return RandomPolicy(k, seed=config.seed)
    raise ConfigError(f"unknown spec_policy {name!r} (off, always, random)")
