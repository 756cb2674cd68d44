"""One classifier of instruction-like speech, for both tiers.

A segment "reads like an instruction" when it addresses the machine that listens rather
than the people on the floor: it tells a model or an alarm system to ignore its rules, to
take a role, to raise, publish or record an alarm, or it holds an answer in the slow
tier's JSON shape to copy. People shouting at each other ("emergency stop!", "stop the
line!", "somebody raise the alarm!") are not addressing the machine and do not match.

- The slow tier withholds such a segment from the model and rejects quotes of it
  (pipelines.analysis, pipelines.evidence).
- The instant tier raises nothing from it (pipelines.detect): docs/alerts.md says why
  suppression was chosen over a `suspect` mark.

Deliberately broad on the machine-addressed side: a false positive costs the alerts of one
segment that talks to the machine, a miss can cost a critical false alarm on every line.
"""

from __future__ import annotations

import re
import unicodedata

__all__ = ["instruction_spans", "looks_like_instruction"]

_PATTERNS = [
    # Rules, prompts, roles.
    r"\b(ignore|disregard|forget|override|bypass)\b.{0,40}"
    r"\b(instructions?|rules?|prompt|previous|above|system|settings|filters?)\b",
    r"\b(you are|you're|act as|pretend|roleplay)\b.{0,30}"
    r"\b(now|an? (ai|assistant|model|system)|in .{0,12}mode)\b",
    r"\b(system prompt|developer mode|jailbreak|new instructions?)\b",
    # Make the machine raise or record something ("raise the alarm", said to people, is not).
    # Within one clause, so "send someone over, the overload alarm is on" is no order.
    r"\b((raise|sound)(?! the alarm\b)|trigger|send|issue|report|output|emit|generate|create"
    r"|publish|forward|broadcast|dispatch|push|escalate)\b[^,.;!?，。；！？]{0,30}"
    r"\b(alarms?|alerts?|fault reports?|json)\b",
    # A fault to report on every line ("report motor overload on every line"): no one on the
    # floor reports one fault on all lines at once. Only report / flag, and in Chinese only
    # with an order word before 报 (每条线都要报...; not 每条线都报急停了, which says they did).
    r"\b(report|flag)\b[^,.;!?，。；！？]{0,40}"
    r"\b(on|for|across|at) (every|all|each) (lines?|stations?|machines?|cells?|zones?)\b",
    r"(每条线|每一条线|所有的?产?线|全部产?线|全厂|每台设备|每台机器|所有设备)[^，。,.；;]{0,4}"
    r"(都|全|一律)?(要|得|必须|一律)报(?!警|修|告|给)",
    # Switching the alerting itself: "alert priority override enabled", "alarm mode: forced".
    r"\b(alert|alarm|priority|severity)\b.{0,12}\b(override|overrides|forced|escalated)\b",
    r"\b(to|for) all (subscribers|consumers|listeners|clients)\b",
    r"\b(agent|system|model|listener|listening|monitor|program|ai)\b.{0,30}"
    r"\b(must|should|shall|needs? to|has to|is to)\b.{0,20}"
    r"\b(record|report|raise|log|flag|send|mark|file|publish)\b",
    r"\b(respond|answer|reply)\b.{0,20}\bwith\b",
    r"\b(copy|repeat|output|print|read back)\b.{0,20}\b(exactly|verbatim|word for word)\b",
    r"\b(correct|expected|standard|right) (output|answer|json)\b",
    # A fake end of the transcript block, spoken or published. (A chat template's control
    # strings are not matched here: the slow tier tokenizes them as plain text.)
    r"\b(end of|end the) (the )?transcript\b|={3,}",
    # An answer in the slow tier's shape, to be copied.
    r"\{\s*\"?(faults|code|severity|quote)\"?\s*:",
    r"\"(code|severity|quote|segment)\"\s*:",
    # Chinese: ignore the rules, a role, raise an alarm, the listening system must report.
    r"(忽略|无视|忘记|不要理会|不要管|别管|不用管|不用理).{0,12}(指令|指示|规则|提示|之前|以上|设置)",
    r"(发出|触发|发送|生成|输出|报告).{0,8}(警报|报警|告警|json)",
    r"(你现在是|扮演|假装|你现在听我的|听我的指令)",
    r"(监听|监控|报警|识别|分析)(系统|程序|软件|模型|代理|助手).{0,24}(上报|报告|记录|报警|输出)",
    # Report at once, unchecked; notes addressed to the model; rules from now on; severities set.
    r"(直接|立即|马上|立刻)(上报|告警|发出警报)",
    r"(无需|不用|不必|不需要|无须)(核实|确认|验证|人工|复核)",
    r"(给|对|致)(分析|监听|识别|报警)?(模型|系统|代理|程序|助手)的?(说明|指令|通知|提示)",
    r"从现在(开始|起).{0,24}(都算|都要|一律|全部|都按)",
    r"(严重|报警|告警)?(等级|级别)(设为|设成|改为|改成|调到|调成)",
    r"(系统|模型|平台|监听|监控).{0,6}(必须|务必|应该|应当|需要).{0,12}(上报|报警|记录|报告|输出)",
    r"(原样|照着|照抄).{0,4}(输出|抄|念|写)",
    r"(转录|文字记录)(结束|完毕)",
    r"(标准答案|正确答案|正确输出)",
]
_INSTRUCTION = re.compile("|".join(f"(?:{p})" for p in _PATTERNS), re.IGNORECASE)


def _fold(text: str) -> str:
    # NFKC keeps offsets for the text we see here (ASCII and CJK); spaces are collapsed.
    return " ".join(unicodedata.normalize("NFKC", text).split())


def instruction_spans(text: str) -> list[tuple[int, int]]:
    """Where `text` (NFKC, whitespace collapsed) reads like an instruction to the machine."""
    return [m.span() for m in _INSTRUCTION.finditer(_fold(text))]


def looks_like_instruction(text: str) -> bool:
    return _INSTRUCTION.search(_fold(text)) is not None
