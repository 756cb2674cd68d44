"""The memory planner's outcome on a fleet candidate (blocking: reads the model's config)."""

from __future__ import annotations

from agent.config.models import AgentConfig

__all__ = ["plan_refusal"]


def plan_refusal(config: AgentConfig) -> str | None:
    """None when the candidate's engine fits (or there is no engine); else the planner's
    outcome, the same one `agentctl plan` prints for a local file."""
    if not config.llm.enabled or config.engine is None:
        return None
    from agent.engine.model_prep import ModelPrepError, model_dir_for
    from agent.engine.planner import PlanError, plan_memory

    try:
        plan = plan_memory(model_dir_for(config.engine), config.engine)
    except (PlanError, ModelPrepError, OSError, ValueError) as exc:
        return f"memory planner: {exc}"
    return None if plan.fits else f"memory planner: {plan.outcome}"
