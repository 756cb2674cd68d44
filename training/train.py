"""Tune a bundled base (SmolLM2-135M-Instruct, Gemma 3 270M) on the corpus, on one CUDA GPU.

    python training/train.py --corpus build/corpus --base <model folder> --out build/adapter
    python training/train.py ... --full --export-rank 64      # every projection, shipped small

Runs where torch, transformers, peft and safetensors are (the lent H200's image has them;
the service's venv does not need them): it imports nothing of the service but the
torch-only modules agent/engine/lora.py and agent/engine/gguf_convert.py (by their paths)
and training/tune_*.py. `--gguf` converts the base from the package's GGUF first, the way
setup does, and the weights digest says whether it is the same base.

Two ways to tune: LoRA (peft) on the seven projections of every layer, or `--full`: the
same projections trained in full (embeddings and norms frozen), the change shipped as a
rank-`--export-rank` adapter by SVD (training/tune_delta.py). Loss only on the answer
tokens (the prompt is what the service sends; the model learns to answer it); weights in
float32 under bf16 autocast. Batches of similar length up to `--batch-tokens`, AdamW with
warmup and cosine decay, seeded; `--max-seconds` plans the steps from the measured pace so
the schedule ends in time. Writes into `--out`: the adapter in bf16
(`adapter_model.safetensors`, `adapter_config.json`), `train_report.json` (settings,
digests, losses, validation per ingredient and language), the loss curve as `loss.csv` and
`loss.png`.
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
sys.path.insert(0, str(REPO))  # run as a script: training/tune_*.py import by package
from training.tune_data import (  # noqa: E402
    batches,
    collate,
    decision_index,
    evaluate,
    load_corpus,
    weighted_loss,
)
from training.tune_delta import export_delta, trainable_projections  # noqa: E402

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _load_by_path(name: str, rel: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, REPO / rel)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _lora_module() -> ModuleType:
    return _load_by_path("edge_lora", "agent/engine/lora.py")


def convert_gguf(gguf: Path, out: Path) -> None:
    """The base as setup makes it (agent/engine/gguf_convert.py: dequantized bf16)."""
    _load_by_path("edge_gguf_convert", "agent/engine/gguf_convert.py").convert(gguf, out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--base", type=Path, required=True, help="converted model folder")
    parser.add_argument("--gguf", type=Path, default=None, help="convert --base from it first")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--full", action="store_true", help="train every projection in full")
    parser.add_argument("--export-rank", type=int, default=64, help="--full: rank shipped")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--alpha", type=float, default=32.0)
    parser.add_argument("--dropout", type=float, default=0.05)
    parser.add_argument("--lr", type=float, default=4e-4)
    parser.add_argument("--epochs", type=float, default=2.0)
    parser.add_argument("--max-seconds", type=float, default=0.0, help="plan steps to end in time")
    parser.add_argument("--batch-tokens", type=int, default=32768)
    parser.add_argument("--warmup", type=float, default=0.05, help="share of the steps")
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--decision-weight", type=float, default=5.0)
    parser.add_argument("--quick", action="store_true", help="no initial eval, no merge check")
    parser.add_argument(
        "--init-adapter", type=Path, default=None, help="continue from this adapter's weights"
    )
    parser.add_argument("--max-examples", type=int, default=0, help="a smoke run's subset")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)

    import torch

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
    if args.max_examples:
        examples = examples[: args.max_examples]
    train = [e for e in examples if not e["val"]]
    val = [e for e in examples if e["val"]] or train[:8]
    manifest = json.loads((args.corpus / "manifest.json").read_text(encoding="utf-8"))
    decision_at = decision_index(train)

    model, params, base_state = _prepare(args, device)
    pad = int(
        model.config.pad_token_id
        if model.config.pad_token_id is not None
        else model.config.eos_token_id
    )
    trainable = sum(p.numel() for p in params)
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
    step, seen_tokens, planned = 0, 0, total
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
            if args.max_seconds and step == 20:
                # The schedule ends in time: steps planned from the pace of the first 20
                # (the evaluations' time and the save kept aside).
                pace = (time.time() - t_train) / step
                fits = int(args.max_seconds * 0.85 / pace)
                if fits < total:
                    total = max(step + 1, fits)
                    print(json.dumps({"replanned_steps": total, "s_per_step": pace}), flush=True)
            if step % args.eval_every == 0 or step == total:
                evals.append({"step": step, **evaluate(model, val, pad, args.batch_tokens)})
                print(json.dumps(evals[-1]), flush=True)
    train_s = time.time() - t_train

    export = _save(args, model, base_state, lora)

    # The service merges the bf16 adapter with agent/engine/lora.py: check that the merged
    # weights give the trained model's answers (greedy tokens on validation examples), and
    # measure the merged model on validation (for --full: what the shipped rank keeps).
    merge_check = None if args.quick else _merge_check(model, args, lora, val, pad, device)
    report = {
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "mode": "full" if args.full else "lora",
        "base": args.base.name,
        "base_weights_sha256": base_digest,
        "adapter_sha256": lora.adapter_digest(args.out),
        "corpus": {
            k: manifest.get(k)
            for k in (
                "seed",
                "generator_streams",
                "people_records",
                "people_passes",
                "joined_windows",
                "examples",
                "by_source",
                "corpus_sha256",
                "generator_sha256",
                "people_sha256",
                "catalogue_sha256",
            )
        },
        "train_examples": len(train),
        "val_examples": len(val),
        "trainable_parameters": trainable,
        "decision_token_index": decision_at,
        "steps": total,
        "steps_planned_by_epochs": planned,
        "steps_per_epoch": per_epoch,
        "epochs_done": round(total / per_epoch, 2),
        "tokens_seen": seen_tokens,
        "train_seconds": round(train_s, 1),
        "tokens_per_second": round(seen_tokens / max(train_s, 1e-9)),
        "wall_seconds": round(time.time() - t_start, 1),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "peak_gpu_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1)
        if torch.cuda.is_available()
        else None,
        "val_before": before,
        "val_after": evals[-1] if evals else None,
        "export": export,
        "evals": evals,
        "merge_check": merge_check,
        "versions": {"torch": torch.__version__, "python": sys.version.split()[0]},
    }
    (args.out / "train_report.json").write_text(json.dumps(report, indent=1) + "\n")
    with (args.out / "loss.csv").open("w") as fh:
        fh.write("step,loss,lr\n")
        fh.writelines(f"{r['step']},{r['loss']:.5f},{r['lr']:.3e}\n" for r in log)
    _plot(args.out, log, evals, f"{report['mode']} on {args.base.name}")
    print(json.dumps({k: v for k, v in report.items() if k != "evals"}, indent=1))
    return 0


def _prepare(args: argparse.Namespace, device: Any) -> tuple[Any, list[Any], Any]:
    """(model, the parameters that train, the base's state for --full or None). float32
    weights under bf16 autocast: AdamW on bf16 weights loses the small updates."""
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(
        str(args.base), dtype=torch.float32, attn_implementation="sdpa"
    ).to(device)
    if args.full:
        base_state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
        return model, trainable_projections(model, TARGETS), base_state
    if args.init_adapter is not None:
        model = PeftModel.from_pretrained(model, str(args.init_adapter), is_trainable=True)
    else:
        config = LoraConfig(
            r=args.rank,
            lora_alpha=args.alpha,
            lora_dropout=args.dropout,
            target_modules=TARGETS,
            task_type="CAUSAL_LM",
        )
        model = get_peft_model(model, config)
    for p in model.parameters():  # a shipped adapter is bf16; train it in fp32
        if p.requires_grad:
            p.data = p.data.float()
    return model, [p for p in model.parameters() if p.requires_grad], None


def _save(
    args: argparse.Namespace, model: Any, base_state: Any, lora: ModuleType
) -> dict[str, Any] | None:
    """The adapter in bf16 under --out; for --full, the change factored (its report)."""
    import torch
    from safetensors.torch import load_file, save_file

    args.out.mkdir(parents=True, exist_ok=True)
    export = None
    if args.full:
        tuned = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        tensors, adapter_config, export = export_delta(base_state, tuned, args.export_rank, TARGETS)
        save_file(tensors, str(args.out / lora.ADAPTER_WEIGHTS))
    else:
        tmp = args.out / ".peft"
        model.save_pretrained(str(tmp))
        weights = load_file(str(tmp / lora.ADAPTER_WEIGHTS))
        save_file(
            {k: v.to(torch.bfloat16).contiguous() for k, v in weights.items()},
            str(args.out / lora.ADAPTER_WEIGHTS),
        )
        adapter_config = json.loads((tmp / lora.ADAPTER_CONFIG).read_text(encoding="utf-8"))
        shutil.rmtree(tmp)
    adapter_config["base_model_name_or_path"] = args.base.name
    (args.out / lora.ADAPTER_CONFIG).write_text(
        json.dumps(adapter_config, indent=1, sort_keys=True) + "\n", encoding="utf-8"
    )
    return export


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
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
                a = model(input_ids=inputs["input_ids"]).logits.argmax(-1)
            b = plain(input_ids=inputs["input_ids"]).logits.argmax(-1)
            start = len(e["prompt"]) - 1
            same += int(torch.equal(a[0, start:-1], b[0, start:-1]))
    return {
        "examples": len(sample),
        "same_greedy_answer_tokens": same,
        "val_merged": evaluate(plain, val, pad, args.batch_tokens),
    }


def _plot(
    out: Path, log: list[dict[str, float]], evals: list[dict[str, float]], title: str
) -> None:
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
    ax.set_title(f"{title}, edge-agent corpus")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "loss.png", dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
