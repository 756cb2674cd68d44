"""The embedded vLLM engine: device profiles, memory planner, speculative decoding, stats.

Importing this package never imports vLLM, torch or transformers; they are loaded when an
engine starts (or a model is converted), so the planner and the profiles work anywhere.
"""

from __future__ import annotations

from agent.engine.engine import Engine
from agent.engine.errors import (
    EngineDead,
    EngineError,
    EngineNotRunning,
    EngineStartError,
    EngineWontFit,
)
from agent.engine.model_prep import ModelPrepError, ensure_default_model
from agent.engine.planner import MemoryPlan, PlanError, plan_memory
from agent.engine.profile import EngineProfile, ProfileError, load_engine_profile
from agent.engine.repetition import RepetitionGuard
from agent.engine.results import (
    ChatMessage,
    EngineHealth,
    EngineInfo,
    EngineState,
    GenerationChunk,
    GenerationResult,
)
from agent.engine.speculative import AcceptanceController, choose_speculation, detect_mtp
from agent.engine.stats import EngineStats

__all__ = [
    "AcceptanceController",
    "ChatMessage",
    "Engine",
    "EngineDead",
    "EngineError",
    "EngineHealth",
    "EngineInfo",
    "EngineNotRunning",
    "EngineProfile",
    "EngineStartError",
    "EngineState",
    "EngineStats",
    "EngineWontFit",
    "GenerationChunk",
    "GenerationResult",
    "MemoryPlan",
    "ModelPrepError",
    "PlanError",
    "ProfileError",
    "RepetitionGuard",
    "choose_speculation",
    "detect_mtp",
    "ensure_default_model",
    "load_engine_profile",
    "plan_memory",
]
