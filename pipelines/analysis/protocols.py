"""What the slow tier needs from outside, as protocols: the engine, its tokenizer, a sink.

The daemon fits them with agent/analysis_link.py; tests and the benchmark with the real
engine or anything else that has these methods.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pipelines.analysis_prompt import ChatFrame
from pipelines.evidence import AcceptedFault

__all__ = [
    "AnalysisLlm",
    "FaultSink",
    "LlmAnswer",
    "LlmUnavailable",
    "TokenCodec",
    "TokenLogprob",
]


class LlmUnavailable(Exception):
    """The engine cannot serve now (stopped, starting, dead); try again when it is back."""


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token: its text as the engine decoded it, and its log-probability
    under the schema (the engine applies the grammar's mask before it samples)."""

    text: str
    logprob: float


class LlmAnswer(Protocol):
    @property
    def text(self) -> str: ...
    @property
    def finish_reason(self) -> str | None: ...
    @property
    def num_prompt_tokens(self) -> int: ...
    @property
    def num_cached_tokens(self) -> int | None: ...
    @property
    def ttft_s(self) -> float | None: ...
    @property
    def tokens(self) -> Sequence[TokenLogprob] | None:
        """Every generated token with its log-probability, where the engine reports them."""


class AnalysisLlm(Protocol):
    async def wait_ready(self) -> None:
        """Return when the engine can take requests."""

    async def complete(
        self,
        prompt: list[int],
        *,
        max_tokens: int,
        json_schema: Mapping[str, Any] | None,
        stop: Sequence[str] = (),
        logprobs: bool = False,
    ) -> LlmAnswer:
        """Raises LlmUnavailable when the engine is not serving. `logprobs`: report each
        generated token's log-probability (`LlmAnswer.tokens`)."""


class TokenCodec(Protocol):
    async def encode(self, texts: Sequence[str], *, trusted: bool) -> list[list[int]]:
        """Token ids of each text, no special tokens added. `trusted` (our template
        pieces): markers such as <|im_end|> become the control tokens they name.
        Untrusted (transcript lines): they stay plain text, so speech cannot close the
        user turn or open a system one."""

    async def chat_frame(self) -> ChatFrame: ...


FaultSink = Callable[[str, Sequence[AcceptedFault]], Awaitable[None]]
