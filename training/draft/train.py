"""Train the EAGLE-3 draft head of the tuned model (training/draft/eagle3.py).

    python training/draft/train.py --target <merged tuned model> --corpus build/draft-corpus \
        --answers build/answers.npz --out build/draft [--max-seconds 180]

Runs where torch, transformers and safetensors are (the lent H200's image; the system
python here for `--smoke`). Each example is a corpus prompt followed by the target's own
greedy answer (`--answers`, from regen.py; without it the corpus target stands in). Per
batch the frozen target runs once (its hidden states at the draft's three layers and its
argmax at every position, the labels); the draft then runs `--ttt` steps of training-time
test: step 0 from the target's features, step j from its own step j-1 output, its query at
position t + j attending to the first step's keys up to t and to its own keys of steps 1..j,
exactly what vLLM's draft KV cache holds while drafting. The loss is cross-entropy against
the target's argmax in the draft vocabulary, weighted 0.8^j per step, on every answer
position and on `--prompt-positions` sampled prompt positions per example.

Validation measures what greedy verification accepts: at each answer position of the
held-out examples, the run of leading draft steps equal to the target's argmax (with greedy
targets the teacher tokens are the drafted tokens until the first miss, so this is the
chain vLLM would accept), as mean accepted length and acceptance rate for k = 1..ttt.

Writes into --out: the draft (config.json, safetensors shards, index), train_report.json,
loss.csv.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script on the GPU host
from training.draft.eagle3 import DraftShape, Eagle3Draft, attention, save_draft, shape_dict

STEP_DECAY = 0.8


def load_examples(corpus: Path, answers: Path | None) -> list[dict[str, Any]]:
    import numpy as np

    data = np.load(corpus / "corpus.npz")
    p_ids, p_off = data["prompt_ids"], data["prompt_offsets"]
    if answers is not None:
        ans = np.load(answers)
        a_ids, a_off = ans["answer_ids"], ans["answer_offsets"]
    else:
        a_ids, a_off = data["target_ids"], data["target_offsets"]
    out = []
    for i in range(min(len(p_off), len(a_off)) - 1):  # regen.py --limit answers a prefix
        prompt = p_ids[p_off[i] : p_off[i + 1]].astype("int64")
        answer = a_ids[a_off[i] : a_off[i + 1]].astype("int64")
        if len(answer) < 2:
            continue
        out.append({"prompt": prompt, "answer": answer, "val": bool(data["val"][i])})
    return out


def draft_vocabulary(examples: list[dict[str, Any]], size: int, vocab: int) -> torch.Tensor:
    """The `size` target ids the answers use most (then the prompts), sorted ascending."""
    counts = torch.zeros(vocab, dtype=torch.float64)
    for ex in examples:
        counts.index_add_(
            0,
            torch.as_tensor(ex["answer"]),
            torch.full((len(ex["answer"]),), 10.0, dtype=torch.float64),
        )
        counts.index_add_(
            0, torch.as_tensor(ex["prompt"]), torch.ones(len(ex["prompt"]), dtype=torch.float64)
        )
    top = torch.topk(counts, size).indices
    return torch.sort(top).values


def batches(
    examples: list[dict[str, Any]], batch_tokens: int, rng: random.Random
) -> list[list[int]]:
    order = sorted(
        range(len(examples)), key=lambda i: len(examples[i]["prompt"]) + len(examples[i]["answer"])
    )
    out: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for i in order:
        n = len(examples[i]["prompt"]) + len(examples[i]["answer"])
        if cur and max(longest, n) * (len(cur) + 1) > batch_tokens:
            out.append(cur)
            cur, longest = [], 0
        cur.append(i)
        longest = max(longest, n)
    if cur:
        out.append(cur)
    rng.shuffle(out)
    return out


def collate(
    examples: list[dict[str, Any]],
    idx: list[int],
    prompt_positions: int,
    rng: random.Random,
    device: torch.device,
) -> dict[str, torch.Tensor]:
    seqs = [torch.as_tensor(list(examples[i]["prompt"]) + list(examples[i]["answer"])) for i in idx]
    lens = torch.tensor([len(s) for s in seqs])
    t_max = int(lens.max())
    ids = torch.zeros(len(seqs), t_max, dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, : len(s)] = s
    chosen, is_answer = [], []
    for b, i in enumerate(idx):
        a, n = len(examples[i]["prompt"]), int(lens[b])
        ans = list(range(a - 1, n - 2))
        pool = list(range(0, max(0, a - 2)))
        pr = sorted(rng.sample(pool, min(prompt_positions, len(pool))))
        chosen.append(pr + ans)
        is_answer.append([False] * len(pr) + [True] * len(ans))
    p_max = max(len(c) for c in chosen)
    pos = torch.zeros(len(idx), p_max, dtype=torch.long)
    valid = torch.zeros(len(idx), p_max, dtype=torch.bool)
    answer = torch.zeros(len(idx), p_max, dtype=torch.bool)
    for b, c in enumerate(chosen):
        pos[b, : len(c)] = torch.tensor(c)
        valid[b, : len(c)] = True
        answer[b, : len(c)] = torch.tensor(is_answer[b])
    return {
        k: v.to(device)
        for k, v in {"ids": ids, "lens": lens, "pos": pos, "valid": valid, "answer": answer}.items()
    }


@torch.no_grad()
def target_pass(
    target: Any, shape: DraftShape, batch: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(features [B, T, 3h] at the aux layers, argmax labels [B, T]) of the frozen target."""
    ids, lens = batch["ids"], batch["lens"]
    mask = torch.arange(ids.shape[1], device=ids.device)[None] < lens[:, None]
    out = target.model(input_ids=ids, attention_mask=mask.long(), output_hidden_states=True)
    hs = out.hidden_states
    feats = torch.cat([hs[i] for i in shape.aux_layers], -1)
    labels = torch.empty_like(ids)
    for start in range(0, ids.shape[1], 1024):  # lm_head in slices: [B, T, vocab] is large
        labels[:, start : start + 1024] = target.lm_head(
            out.last_hidden_state[:, start : start + 1024]
        ).argmax(-1)
    return feats, labels


def gather(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x [B, T, d] at index [B, P] -> [B, P, d]."""
    return torch.gather(x, 1, index[..., None].expand(-1, -1, x.shape[-1]))


def ttt_forward(
    draft: Eagle3Draft,
    embed: torch.nn.Module,
    batch: dict[str, torch.Tensor],
    feats: torch.Tensor,
    labels: torch.Tensor,
    steps: int,
    lut: torch.Tensor,
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """Per step: logits [B, P, Vd], draft labels [B, P] (-1: none), label mask [B, P]."""
    ids, lens, pos, valid = batch["ids"], batch["lens"], batch["pos"], batch["valid"]
    b, t = ids.shape
    nxt = torch.cat([ids[:, 1:], ids[:, -1:]], 1)
    emb_all = embed(nxt)
    feat0 = draft.fc(feats)
    arange_t = torch.arange(t, device=ids.device)
    _q0, k0, v0 = draft.qkv(emb_all, feat0, arange_t[None].expand(b, t))
    key_ok = (arange_t[None, None] <= pos[..., None]) & (
        arange_t[None, None] <= (lens - 2)[:, None, None]
    )
    key_ok &= valid[..., None]
    key_ok[..., 0] = True  # a padded query keeps one key (its output is masked anyway)
    feat = gather(feat0, pos)
    extra_k: list[torch.Tensor] = []
    extra_v: list[torch.Tensor] = []
    logits_all, labels_all, masks = [], [], []
    for j in range(steps):
        tok_at = (pos + 1 + j).clamp(max=t - 1)
        emb = gather(emb_all, (pos + j).clamp(max=t - 1))  # emb of ids[pos + 1 + j]
        q, k, v = draft.qkv(emb, feat, pos + j)
        if j > 0:
            extra_k.append(k)
            extra_v.append(v)
        attn = attention(q, k0, v0, key_ok, extra_k, extra_v)
        normed, pre = draft.finish(attn, feat)
        logits_all.append(draft.lm_head(normed))
        lab_t = torch.gather(labels, 1, tok_at)
        ok = valid & (pos + 1 + j <= (lens - 2)[:, None])
        labels_all.append(torch.where(ok, lut[lab_t], torch.full_like(lab_t, -1)))
        masks.append(ok)
        feat = pre
    return logits_all, labels_all, masks


def loss_of(
    logits: list[torch.Tensor],
    labels: list[torch.Tensor],
    answer: torch.Tensor,
    prompt_weight: float,
) -> torch.Tensor:
    total = logits[0].new_zeros((), dtype=torch.float32)
    for j, (lg, lb) in enumerate(zip(logits, labels, strict=False)):
        w = torch.where(answer, 1.0, prompt_weight) * (lb >= 0)
        ce = F.cross_entropy(lg.float().flatten(0, 1), lb.clamp(min=0).flatten(), reduction="none")
        total = total + STEP_DECAY**j * (ce * w.flatten()).sum() / w.sum().clamp(min=1)
    return total


@torch.no_grad()
def evaluate(
    draft: Eagle3Draft,
    embed: Any,
    target: Any,
    examples: list[dict[str, Any]],
    idx: list[int],
    args: argparse.Namespace,
    device: torch.device,
    lut: torch.Tensor,
) -> dict[str, Any]:
    rng = random.Random(0)
    runs: list[torch.Tensor] = []
    step_hits = torch.zeros(args.ttt)
    step_n = torch.zeros(args.ttt)
    for group in batches([examples[i] for i in idx], args.batch_tokens, rng):
        sub = [idx[g] for g in group]
        batch = collate(examples, sub, 0, rng, device)
        feats, labels = target_pass(target, draft.shape, batch)
        with _autocast(device):
            logits, labs, masks = ttt_forward(draft, embed, batch, feats, labels, args.ttt, lut)
        alive = batch["valid"] & batch["answer"]
        run = torch.zeros_like(batch["pos"])
        for j in range(args.ttt):
            hit = (logits[j].argmax(-1) == labs[j]) & masks[j]
            step_hits[j] += (hit & alive).sum().cpu()
            step_n[j] += (alive & masks[j]).sum().cpu()
            alive = alive & hit
            run += alive.long()
        runs.append(run[batch["valid"] & batch["answer"]].cpu())
    allrun = torch.cat(runs).float() if runs else torch.zeros(1)
    out: dict[str, Any] = {"positions": int(allrun.numel())}
    for k in range(1, args.ttt + 1):
        accepted = allrun.clamp(max=k).mean().item()
        out[f"k{k}"] = {
            "mean_accepted": round(accepted, 4),
            "acceptance_rate": round(accepted / k, 4),
            "mean_accepted_length": round(1 + accepted, 4),
        }
    pairs = zip(step_hits.tolist(), step_n.tolist(), strict=True)
    out["step_accuracy"] = [round(h / max(n, 1), 4) for h, n in pairs]
    return out


def _autocast(device: torch.device) -> Any:
    return (
        torch.autocast("cuda", dtype=torch.bfloat16)
        if device.type == "cuda"
        else torch.autocast("cpu", enabled=False)
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--target", type=Path, required=True, help="the merged tuned model folder")
    ap.add_argument("--corpus", type=Path, required=True)
    ap.add_argument(
        "--answers", type=Path, help="answers.npz from regen.py (default: corpus targets)"
    )
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--draft-vocab", type=int, default=8192)
    ap.add_argument("--ttt", type=int, default=4, help="training-time-test steps (the largest k)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--epochs", type=float, default=10.0)
    ap.add_argument("--max-seconds", type=float, default=180.0, help="stop training after this")
    ap.add_argument("--batch-tokens", type=int, default=32768)
    ap.add_argument("--prompt-positions", type=int, default=128)
    ap.add_argument("--prompt-weight", type=float, default=0.3)
    ap.add_argument("--max-examples", type=int, default=0, help="0: all (smoke runs take few)")
    ap.add_argument("--max-len", type=int, default=0, help="skip longer examples (0: none)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args(argv)

    import transformers

    t_start = time.perf_counter()
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    device = torch.device(args.device)
    cfg = json.loads((args.target / "config.json").read_text())
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    target: Any = transformers.AutoModelForCausalLM.from_pretrained(str(args.target), dtype=dtype)
    target = target.to(device).eval()
    target.requires_grad_(False)
    embed = target.model.embed_tokens
    examples = load_examples(args.corpus, args.answers)
    if args.max_len:
        examples = [e for e in examples if len(e["prompt"]) + len(e["answer"]) <= args.max_len]
    if args.max_examples:
        examples = examples[: args.max_examples]
    val_idx = [i for i, e in enumerate(examples) if e["val"]] or list(range(min(4, len(examples))))
    train_idx = [i for i, e in enumerate(examples) if not e["val"]] or list(range(len(examples)))
    shape = DraftShape.from_target(cfg, args.draft_vocab)
    draft = Eagle3Draft(shape)
    vocab_ids = draft_vocabulary([examples[i] for i in train_idx], shape.draft_vocab, shape.vocab)
    draft.set_vocab(vocab_ids, embed.weight.detach())
    draft = draft.to(device)
    lut = draft.target_to_draft()
    opt = torch.optim.AdamW(draft.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    train_ex = [examples[i] for i in train_idx]
    per_epoch = len(batches(train_ex, args.batch_tokens, random.Random(0)))
    total_steps = max(1, int(per_epoch * args.epochs))
    warm = max(1, min(total_steps // 20, 100))
    print(
        f"examples train={len(train_idx)} val={len(val_idx)} batches/epoch={per_epoch} "
        f"steps<={total_steps} device={device}",
        flush=True,
    )
    before = evaluate(draft, embed, target, examples, val_idx, args, device, lut)
    rows: list[dict[str, Any]] = []
    step, t_train = 0, time.perf_counter()
    stopped = "epochs"
    while step < total_steps:
        for group in batches(train_ex, args.batch_tokens, rng):
            if step >= total_steps:
                break
            if time.perf_counter() - t_train > args.max_seconds:
                stopped = "max_seconds"
                break
            batch = collate(train_ex, group, args.prompt_positions, rng, device)
            feats, labels = target_pass(target, shape, batch)
            # cosine over whichever ends first: the steps or the time budget
            done = max(step / total_steps, (time.perf_counter() - t_train) / args.max_seconds)
            lr = (
                args.lr
                * min(1.0, (step + 1) / warm)
                * 0.5
                * (1 + math.cos(math.pi * min(1.0, done)))
            )
            for g in opt.param_groups:
                g["lr"] = lr
            with _autocast(device):
                logits, labs, _ = ttt_forward(draft, embed, batch, feats, labels, args.ttt, lut)
                loss = loss_of(logits, labs, batch["answer"], args.prompt_weight)
            opt.zero_grad(set_to_none=True)
            loss_any: Any = loss  # torch's backward is untyped
            loss_any.backward()
            torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
            opt.step()
            step += 1
            rows.append(
                {
                    "step": step,
                    "loss": round(loss.item(), 5),
                    "lr": lr,
                    "seconds": round(time.perf_counter() - t_train, 2),
                }
            )
            if step % 50 == 0 or step == 1:
                print(
                    f"step {step} loss {loss.item():.4f} lr {lr:.2e} "
                    f"{time.perf_counter() - t_train:.0f}s",
                    flush=True,
                )
        else:
            continue
        break
    train_s = time.perf_counter() - t_train
    after = evaluate(draft, embed, target, examples, val_idx, args, device, lut)
    files = save_draft(draft.cpu(), cfg, args.out)
    report = {
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "shape": shape_dict(shape),
        "examples": {"train": len(train_idx), "val": len(val_idx)},
        "answers": "target greedy (regen.py)" if args.answers else "corpus targets",
        "steps": step,
        "stopped_by": stopped,
        "train_seconds": round(train_s, 1),
        "total_seconds": round(time.perf_counter() - t_start, 1),
        "val_before": before,
        "val_after": after,
        "files": files,
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    (args.out / "train_report.json").write_text(json.dumps(report, indent=1))
    with (args.out / "loss.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=["step", "loss", "lr", "seconds"])
        w.writeheader()
        w.writerows(rows)
    print(
        json.dumps({"val_after": after, "steps": step, "train_seconds": round(train_s, 1)}),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
