"""The fixed spoken set of bench/asr: what espeak-ng says, what should be heard, and which
catalogue fault (configs/agent.yaml) the keyword tier should raise from it.

- English fault sentences name a fault the way a person on the line would, not always in
  the catalogue's exact words ("the belt is slipping", "the fan motor is overheating").
- English non-fault sentences are ordinary line chatter; some are near misses on purpose
  (a temperature that is normal, a negated leak, vibration that was fixed), because a false
  alarm costs more than a slow one.
- Mandarin is spoken from tone-numbered pinyin by espeak-ng's `cmn-latn-pinyin` voice (its
  hanzi dictionary is poor); the reference is the hanzi. The voice is robotic, so these
  are short, common words without numbers (a number could be written as a digit or a
  hanzi, and the CER would measure the spelling, not the hearing).

References spell numbers as words, as they are spoken; bench_asr.py maps the recogniser's
digits to words before scoring.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["SENTENCES", "Sentence"]


@dataclass(frozen=True)
class Sentence:
    id: str
    lang: Literal["en", "zh"]
    speak: str  # what espeak-ng reads (pinyin for zh)
    reference: str  # what a perfect transcript says (hanzi for zh)
    fault: str | None  # the catalogue code the keyword tier should raise, None: no alert

    @property
    def voice(self) -> str:
        return "cmn-latn-pinyin" if self.lang == "zh" else "en-us"


def _en(id: str, text: str, fault: str | None) -> Sentence:
    return Sentence(id, "en", text, text, fault)


def _zh(id: str, pinyin: str, hanzi: str, fault: str | None) -> Sentence:
    return Sentence(id, "zh", pinyin, hanzi, fault)


SENTENCES: tuple[Sentence, ...] = (
    # English, faults
    _en("en-temp", "Warning, the temperature is over limit on oven two", "temperature_over_limit"),
    _en("en-overheat", "The fan motor on line one is overheating", "temperature_over_limit"),
    _en("en-bearing", "I hear a bearing abnormal noise on roller four", "bearing_noise"),
    _en("en-bearing2", "The bearing is making noise on the main shaft", "bearing_noise"),
    _en("en-overload", "Motor overload alarm on pump three", "motor_overload"),
    _en("en-oil", "There is an oil leak under press five", "leak"),
    _en("en-air", "We have an air leak at the compressor", "leak"),
    _en("en-estop", "Emergency stop, emergency stop on line three", "emergency_stop"),
    _en("en-belt", "The belt is slipping on conveyor one", "belt_slip"),
    _en("en-vib", "Abnormal vibration on the spindle of lathe six", "abnormal_vibration"),
    # English, no fault
    _en("en-shift", "Shift started, the conveyor is running at normal speed", None),
    _en("en-quality", "Quality check on batch twelve passed, moving on", None),
    _en("en-forklift", "Forklift coming through aisle four, watch your step", None),
    _en("en-ribbon", "The label printer on station five has a new ribbon", None),
    _en("en-pressure", "Pressure on the hydraulic unit reads normal", None),
    _en("en-break", "Break at ten thirty, Maria covers station two", None),
    _en("en-temp-ok", "The temperature on oven two is normal today", None),
    _en("en-no-leak", "We checked the pump and there is no oil leak", None),
    # Mandarin (measured while choosing them: with the language forced to zh these are
    # mostly heard; left to auto-detection most are taken for English)
    _zh("zh-temp", "wen1 du4 chao1 guo4 shang4 xian4", "温度超过上限", "temperature_over_limit"),
    _zh("zh-bearing", "zhou2 cheng2 you3 yi4 xiang3", "轴承有异响", "bearing_noise"),
    _zh("zh-belt", "pi2 dai4 da3 hua2", "皮带打滑", "belt_slip"),
    _zh("zh-motor", "dian4 ji1 guo4 zai3", "电机过载", "motor_overload"),
    _zh("zh-estop", "jin3 ji2 ting2 ji1", "紧急停机", "emergency_stop"),
    _zh("zh-normal", "sheng1 chan3 xian4 yun4 xing2 zheng4 chang2", "生产线运行正常", None),
    _zh("zh-temp-ok", "wen1 du4 zheng4 chang2", "温度正常", None),
    _zh("zh-shift", "xia4 yi2 ge4 ban1 ci4 kai1 shi3 le", "下一个班次开始了", None),
)
