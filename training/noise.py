"""ASR-style damage to a segment, applied to its text and its evidence quote alike.

What a recogniser does to speech: no punctuation or case, a word dropped, homophones
(轴成 for 轴承, "noice" for "noise"). The quote is damaged first and put back in place, so
it is still an exact substring of what the model reads; the caller checks that the damaged
quote still passes the evidence rules and keeps the clean segment otherwise.
"""

from __future__ import annotations

import random
import re

__all__ = ["damage"]

# Near misses a recogniser makes on the words that matter (the keyword tier is tolerant of
# them; the model must copy them as heard).
_EN_MISHEARD = {
    "bearing": ["berring", "baring", "bearin"],
    "noise": ["noice", "nose"],
    "temperature": ["temprature", "tempature"],
    "vibration": ["vibrashun", "vibratin"],
    "vibrating": ["vibratin"],
    "motor": ["moter", "mota"],
    "overload": ["over load", "overlode"],
    "overloaded": ["over loaded"],
    "leaking": ["leakin", "leeking"],
    "leak": ["leek"],
    "slipping": ["slippin", "sleeping"],
    "grinding": ["grindin", "grinning"],
    "squealing": ["squeelin", "squeeling"],
    "degrees": ["degree", "degress"],
    "roller": ["rola", "rolla"],
    "conveyor": ["conveyer", "convair"],
    "emergency": ["emergancy", "emerge and see"],
    "breaker": ["braker"],
    "shaking": ["shakin"],
}
_EN_DROPPABLE = {"the", "a", "is", "it's", "there's", "of", "on", "and", "really", "so"}
_ZH_HOMOPHONES = {
    "轴承": ["轴成", "周承"],
    "温度": ["温都", "文度"],
    "皮带": ["皮袋"],
    "电机": ["点机", "电鸡"],
    "振动": ["震动", "阵动"],
    "异响": ["一响", "异想"],
    "漏油": ["露油", "漏由"],
    "过载": ["过在"],
    "急停": ["即停", "级停"],
    "发烫": ["发汤"],
    "打滑": ["大滑"],
    "跳闸": ["跳扎"],
}
_EN_PUNCT = re.compile(r"[,.!?;:]")
_ZH_PUNCT = re.compile(r"[，。！？；：、,.!?]")


def damage(text: str, quote: str, lang: str, rng: random.Random) -> tuple[str, str]:
    """(text, quote) as a recogniser might have produced them; the quote stays a substring.

    Each kind of damage is drawn on its own; most segments get one or two of them.
    """
    if quote not in text:
        raise ValueError("the quote must be a substring of the text")
    if lang == "zh":
        return _damage_zh(text, quote, rng)
    return _damage_en(text, quote, rng)


def _swap_in(text: str, quote: str, new: str) -> tuple[str, str]:
    return text.replace(quote, new, 1), new


def _damage_en(text: str, quote: str, rng: random.Random) -> tuple[str, str]:
    if rng.random() < 0.5:  # misheard words, in the quote and around it
        for word, wrong in _EN_MISHEARD.items():
            pattern = re.compile(rf"\b{word}\b", re.IGNORECASE)
            if pattern.search(text) and rng.random() < 0.5:
                choice = rng.choice(wrong)
                new_quote = pattern.sub(choice, quote)
                text = pattern.sub(choice, text.replace(quote, "\x00", 1))
                text, quote = text.replace("\x00", new_quote, 1), new_quote
    if rng.random() < 0.3:  # a small word lost inside the quote
        words = quote.split(" ")
        idx = [i for i, w in enumerate(words[1:-1], 1) if w.lower() in _EN_DROPPABLE]
        if idx:
            del words[rng.choice(idx)]
            text, quote = _swap_in(text, quote, " ".join(words))
    if rng.random() < 0.5:  # no case, no punctuation: a run-on line
        text, quote = text.lower(), quote.lower()
        if rng.random() < 0.8:
            text, quote = _EN_PUNCT.sub("", text), _EN_PUNCT.sub("", quote)
            text, quote = " ".join(text.split()), " ".join(quote.split())
    return text, quote


def _damage_zh(text: str, quote: str, rng: random.Random) -> tuple[str, str]:
    if rng.random() < 0.5:
        for word, wrong in _ZH_HOMOPHONES.items():
            if word in text and rng.random() < 0.5:
                choice = rng.choice(wrong)
                text, quote = text.replace(word, choice), quote.replace(word, choice)
    roll = rng.random()
    if roll < 0.35:  # no punctuation at all
        text, quote = _ZH_PUNCT.sub("", text), _ZH_PUNCT.sub("", quote)
    elif roll < 0.75:  # a pause where the comma was: what recognisers usually print
        text = " ".join(_ZH_PUNCT.sub(" ", text).split())
        quote = " ".join(_ZH_PUNCT.sub(" ", quote).split())
    return text, quote
