"""The slow tier: per-stream rolling contexts and LLM fault analyses that point at evidence.

Data flow per stream: the daemon hands every merged transcript segment to `Analyzer.add()`
(cheap, synchronous, bounded); a worker later absorbs what is pending into the stream's
`ContextWindow` (tokenized off the event loop by the codec), asks the engine for faults
as JSON under a schema (a code and a segment number each), checks every fault against the
segment it names (pipelines.evidence) and hands accepted faults
to the daemon, which feeds them to the same alert tracker as the keyword tier.

The package, in the order a segment meets it:
- settings.py: `AnalysisSettings`, the `llm:` section of the agent config;
- protocols.py: what the stage needs from outside (`AnalysisLlm`, `TokenCodec`, the sink):
  tests and the benchmark run it on the real engine or anything that fits;
- state.py: one stream's pending segments, window, counters and snapshot;
- scheduler.py: `Analyzer`, which picks the next stream and runs one analysis in steps;
- window.py: feeding the window, and the note kept on what leaves it;
- answer.py: asking the engine, judging its answer, what is news (`AnalysisReport`);
- confidence.py: each answered fault's probability, from the engine's token log-probs.
The prompt text itself is pipelines/analysis_prompt.py.
"""

from __future__ import annotations

from pipelines.analysis.answer import AnalysisReport
from pipelines.analysis.protocols import (
    AnalysisLlm,
    LlmAnswer,
    LlmUnavailable,
    TokenCodec,
    TokenLogprob,
)
from pipelines.analysis.scheduler import Analyzer
from pipelines.analysis.settings import AnalysisSettings
from pipelines.analysis.window import WITHHELD

__all__ = [
    "WITHHELD",
    "AnalysisLlm",
    "AnalysisReport",
    "AnalysisSettings",
    "Analyzer",
    "LlmAnswer",
    "LlmUnavailable",
    "TokenCodec",
    "TokenLogprob",
]
