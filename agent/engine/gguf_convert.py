"""A bundled GGUF into the HF folder vLLM serves: the one conversion setup and training share.

Imports nothing of this project (only torch and transformers, with gguf), so that
training/train.py and training/draft/prepare_target.py load it by path on a GPU machine
that has nothing else, and the base they train on is byte for byte the base the service
merges into (the weights digest says so).

- transformers loads GGUF weights through its GGUF quantizer; saving with it attached
  writes a `quantization_config` that vLLM would try to honour, so the quantizer and the
  config entry are dropped first: what is saved is plain dequantized bf16.
- A GGUF without a chat template (Gemma 3 270M is the pretrained model, not the
  instruction-tuned one) gets Gemma's own turn format, so the slow tier's prompt has the
  same structure on every base; the template puts `<bos>` first, without which the model
  repeats itself (the converted tokenizer does not add it).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["GEMMA_CHAT_TEMPLATE", "convert"]

# Gemma 3's turn format (system text folded into the first user turn, as Gemma does).
GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first = messages[0]['content'] + '\n\n' -%}{%- set rest = messages[1:] -%}"
    "{%- else -%}{%- set first = '' -%}{%- set rest = messages -%}{%- endif -%}"
    "{%- for m in rest -%}"
    "{%- set role = 'model' if m['role'] == 'assistant' else m['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first if loop.first else '') + m['content']"
    " + '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)


def convert(gguf: Path, out: Path) -> None:
    """Write the HF folder of `gguf` into `out` (bf16 safetensors, tokenizer, config)."""
    # Forced, not defaulted: a stray HF_HUB_OFFLINE=0 must not let it reach the hub.
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    import torch
    import transformers

    hf_logging: Any = transformers.utils.logging
    hf_logging.disable_progress_bar()
    src, name = str(gguf.parent), gguf.name
    tokenizer: Any = transformers.AutoTokenizer.from_pretrained(
        src, gguf_file=name, local_files_only=True
    )
    model: Any = transformers.AutoModelForCausalLM.from_pretrained(
        src, gguf_file=name, dtype=torch.bfloat16, local_files_only=True
    )
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    if not getattr(tokenizer, "chat_template", None) and "<start_of_turn>" in tokenizer.get_vocab():
        tokenizer.chat_template = GEMMA_CHAT_TEMPLATE
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
