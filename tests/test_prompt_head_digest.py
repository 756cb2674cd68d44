"""The slow tier's prompt head for the shipped catalogue, byte for byte.

The tuned model (models/smollm2-135m-edge) was trained on prompts rendered by
pipelines.analysis_prompt.render_head, which prints each rule's code, English label,
severity and first six English `related` words. A catalogue rewrite for the keyword tier
(subject and symptom terms, classes) must leave that text unchanged, or the model is served
a prompt it was never trained on. These digests were taken on main (cd27ad6) before the
rewrite; change them only together with a retrained model.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from agent.config import load_config
from pipelines.analysis_prompt import ChatFrame, render_head

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "agent.yaml"
DIGESTS = {
    True: "b5f4e3df6744cb147f582f574c0a8723eb05b862d349dd8a9ff2ec840ff89141",
    False: "2c4726e9361b77c29acc80d23a53dc8825ae3ff86ed6b9f6c36abb3334dcb5d2",
}


@pytest.mark.parametrize("allow_other", [True, False])
def test_shipped_catalogue_renders_the_trained_head(allow_other: bool) -> None:
    faults = load_config(CONFIG, overrides=["llm.enabled=false"]).config.faults
    head = render_head(ChatFrame.plain(), faults, [], allow_other=allow_other)
    assert hashlib.sha256(head.encode()).hexdigest() == DIGESTS[allow_other]
