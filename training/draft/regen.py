"""The tuned model's own greedy answers to every corpus prompt (what the draft learns from).

    python training/draft/regen.py --model <merged tuned model> --corpus DIR --out answers.npz

vLLM offline, greedy, the corpus prompts as token ids (rendered by the service's own prompt
code when the corpus was made), up to --max-tokens answer tokens each, the end token kept.
Writes answer_ids / answer_offsets aligned with the corpus' examples, and prints how many
answers equal the corpus target.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script on the GPU host
from training.draft.vllm_run import engine_kwargs, load_prompts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--corpus", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--max-tokens", type=int, default=192)
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--eager", action="store_true")
    args = ap.parse_args(argv)

    import numpy as np
    import torch
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    on_gpu = torch.cuda.is_available()
    prompts = load_prompts(args.corpus, args.limit)
    t0 = time.perf_counter()
    llm = LLM(**engine_kwargs(args.model, on_gpu=on_gpu, eager=args.eager))
    start_s = time.perf_counter() - t0
    sp = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, detokenize=False)
    t1 = time.perf_counter()
    requests: list[Any] = [TokensPrompt(prompt_token_ids=p) for p in prompts]  # type: ignore[typeddict-item]
    outs = llm.generate(requests, sp)
    gen_s = time.perf_counter() - t1
    answers = [list(o.outputs[0].token_ids) for o in outs]
    offsets = np.cumsum([0] + [len(a) for a in answers]).astype("int64")
    flat = np.array([t for a in answers for t in a], dtype="int64")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez(args.out, answer_ids=flat, answer_offsets=offsets)
    data = np.load(args.corpus / "corpus.npz")
    t_ids, t_off = data["target_ids"], data["target_offsets"]
    same = sum(
        answers[i][: t_off[i + 1] - t_off[i]] == t_ids[t_off[i] : t_off[i + 1]].tolist()
        for i in range(len(answers))
    )
    report = {
        "prompts": len(prompts),
        "answer_tokens": len(flat),
        "equal_to_corpus_target": int(same),
        "engine_start_s": round(start_s, 1),
        "generate_s": round(gen_s, 1),
    }
    print(json.dumps(report), flush=True)
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
