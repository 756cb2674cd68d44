"""The decoder's initial prompt: the catalogue's fault labels in the clip's language.

Whisper continues the style and vocabulary of its prompt; naming the fault terms fixes the
near-misses that matter ("temperature over limit" heard as "over a little bit" without it,
measured in ../shared/research/asr-mqtt-systemd-deb.md). The prompt is short (labels, not
every keyword): Whisper keeps at most 224 prompt tokens, and a long prompt invites the
decoder to repeat it over silence.
"""

from __future__ import annotations

from collections.abc import Sequence

from pipelines.detect import FaultRule

__all__ = ["catalogue_prompt"]

_LEAD = {
    "en": "Factory line alarms: ",
    "zh": "以下是普通话的工厂设备报警：",
}
_SEP = {"zh": "，"}
_MAX_CHARS = 400
_KEYWORDS_PER_FAULT = 3  # the common phrasings; the label alone missed 温度超过上限


def catalogue_prompt(faults: Sequence[FaultRule], lang: str, extra: str | None) -> str | None:
    """The prompt for `lang`: its lead-in, each fault's label and first keywords (each
    phrase once), then the operator's extra text. None when there is nothing to say."""
    words: list[str] = []
    for rule in faults:
        label = rule.labels.get(lang)
        if label:
            words.append(label)
        words += (rule.keywords.get(lang) or [])[:_KEYWORDS_PER_FAULT]
    sep = _SEP.get(lang, ", ")
    lead, end = _LEAD.get(lang, ""), ("。" if lang == "zh" else ".")
    tail = f" {extra.strip()}" if extra and extra.strip() else ""
    kept: list[str] = []
    for word in dict.fromkeys(words):  # whole phrases only, within the budget
        if len(lead) + len(sep.join([*kept, word])) + len(end) + len(tail) > _MAX_CHARS:
            break
        kept.append(word)
    text = (lead + sep.join(kept) + end if kept else "") + tail
    return text.strip() or None
