"""What a spawn decides once and freezes for the process's life."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpawnPlan:
    agent: str
    provider: str | None
    model: str | None
    skills: list[str]
    allowed_tools: list[str]
    system_prompt: str
    # Manifest defaults (max_steps, max_tokens, max_cost, step_timeout,
    # context_budget); the request overrides each one it sets.
    budget: dict = field(default_factory=dict)
    fallback_model: str | None = None
    fallback_provider: str | None = None
    # Skills the Skill tool and Read may reach beyond the loaded ones: None =
    # every loadable skill without disable-model-invocation.
    usable_skills: list[str] | None = None
    # May an activated skill's allowed-tools join the grants? (docs/skills.md)
    skill_grants: bool = True
