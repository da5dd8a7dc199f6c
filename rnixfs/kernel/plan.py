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
    # Manifest budgets (max_steps, max_tokens, max_cost, step_timeout,
    # context_budget, max_time, ctx_size); the request overrides each one it
    # sets, and what neither sets comes from the daemon's Limits.
    budget: dict = field(default_factory=dict)
    fallback_model: str | None = None
    fallback_provider: str | None = None
    # Skills the Skill tool and Read may reach beyond the loaded ones: None =
    # every loadable skill without disable-model-invocation.
    usable_skills: list[str] | None = None
    # May an activated skill's allowed-tools join the grants? (docs/skills.md)
    skill_grants: bool = True
    reasoning_effort: str = ""
    planning: bool = False  # the built-in default agent does not plan
    # manifest fields the daemon does not act on, unknown keys...: traced at spawn
    warnings: list[str] = field(default_factory=list)
    # MCP servers whose tools the process gets as mcp__<server>__<tool>;
    # inline definitions (agent.yaml ``mcp: {servers: …}``) travel with it.
    mcp_servers: list[str] = field(default_factory=list)
    mcp_inline: dict = field(default_factory=dict)
