"""The slow tier's prompt head for the shipped catalogue, byte for byte.

The tuned models (models/) were trained on prompts rendered by
pipelines.analysis_prompt.render_head, which prints the instructions and each rule's code,
English label, severity and first six English `related` words. A catalogue rewrite for the
keyword tier (subject and symptom terms, classes) must leave that text unchanged, or the
model is served a prompt it was never trained on. These digests are those of the head the
pointing models were trained on (the answer format of 2026-12-02); change them only
together with a retrained model.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from agent.config import load_config
from pipelines.analysis_prompt import ChatFrame, render_head

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "agent.yaml"
DIGESTS = {
    True: "e7a448873576b070dee16df8129f515be48238476561da68f9dbe0485201bdb1",
    False: "c71c067b0e71619df54b62c576c97298726cdbc8dd68db5ac0fb3d91450ec32d",
}


@pytest.mark.parametrize("allow_other", [True, False])
def test_shipped_catalogue_renders_the_trained_head(allow_other: bool) -> None:
    faults = load_config(CONFIG, overrides=["llm.enabled=false"]).config.faults
    head = render_head(ChatFrame.plain(), faults, [], allow_other=allow_other)
    assert hashlib.sha256(head.encode()).hexdigest() == DIGESTS[allow_other]
