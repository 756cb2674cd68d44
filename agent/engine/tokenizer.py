"""Our own tokenizer instance, and encoding text and chat messages with it.

Prompts are tokenized with a tokenizer loaded by us (transformers, from the served folder)
and used on one dedicated thread per engine run: the Rust tokenizer is not safe to share
with vLLM's detokenizer across threads, and a long transcript takes long enough to tokenize
that it must not run on the loop. These functions are what runs on that thread.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent.engine.lazy import require_module

__all__ = ["encode", "encode_chat", "load_tokenizer"]


def load_tokenizer(model_dir: Path) -> Any:
    transformers = require_module("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)


def encode(tokenizer: Any, text: str) -> list[int]:
    """Token ids of plain text (no special tokens added)."""
    return [int(t) for t in tokenizer.encode(text, add_special_tokens=False)]


def encode_chat(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of `messages` under the model's chat template, ready for an answer."""
    # Render to text, then encode: apply_chat_template(tokenize=True) returns different
    # types across transformers 4 and 5. The template adds its own special tokens.
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return encode(tokenizer, str(text))
