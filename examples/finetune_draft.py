"""Fine-tune a draft model on the traffic specscope captured (docs/classes.md, "Fixing a weak class").

A short distillation in plain PyTorch and transformers on the captured rows of the weak class. With ``--target``
(the served target) the draft learns the target's whole next-token distribution at every position of the rows
(KL divergence, the target's logits recomputed here); without it, the target's own completions (cross-entropy on
the tokens where ``loss_mask`` is 1), which on a few hundred rows learns those rows more than the class. It is
sized for the tiny models specscope tests with (seconds to minutes on a CPU); real drafts and EAGLE heads are
trained with vllm-project/speculators on GPUs, from the same files (``speculators prepare-data --data DIR``).

    python examples/finetune_draft.py DRAFT_DIR CAPTURE_DIR_OR_FILE -o NEW_DRAFT_DIR [--target TARGET_DIR]
        [--class hard] [--epochs 12] [--lr 1e-5]

Prints one JSON line: rows trained on, steps, and the loss on those rows before and after.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any


def load_rows(source: Path, traffic_class: str | None) -> list[dict[str, Any]]:
    """The captured rows of ``source`` (a file, or every ``*.jsonl`` in a directory), of ``traffic_class`` if
    given, in the order of their tokens (the writer's order varies with concurrency; training should not)."""
    files = sorted(source.glob("*.jsonl")) if source.is_dir() else [source]
    rows = [json.loads(line) for f in files for line in f.read_text().splitlines() if line.strip()]
    return sorted((r for r in rows if traffic_class is None or r.get("class") == traffic_class),
                  key=lambda r: r["input_ids"])


def batches(rows: list[dict[str, Any]], size: int, pad: int) -> list[tuple[Any, Any, Any]]:
    """(input ids, attention mask, labels) tensors: labels are the ids where the row's loss mask is 1, else -100."""
    import torch

    out = []
    for i in range(0, len(rows), size):
        chunk = rows[i:i + size]
        width = max(len(r["input_ids"]) for r in chunk)
        ids = torch.full((len(chunk), width), pad, dtype=torch.long)
        attention = torch.zeros((len(chunk), width), dtype=torch.long)
        labels = torch.full((len(chunk), width), -100, dtype=torch.long)
        for j, r in enumerate(chunk):
            n = len(r["input_ids"])
            ids[j, :n] = torch.tensor(r["input_ids"])
            attention[j, :n] = 1
            labels[j, :n] = torch.tensor([t if m else -100 for t, m in zip(r["input_ids"], r["loss_mask"],
                                                                              strict=True)])
        out.append((ids, attention, labels))
    return out


def loss_of(model: Any, target: Any, ids: Any, attention: Any, labels: Any) -> Any:
    """KL(target || draft) over the row's positions where ``target`` is given, else cross-entropy on ``labels``."""
    import torch

    if target is None:
        return model(input_ids=ids, attention_mask=attention, labels=labels).loss
    logp = torch.log_softmax(model(input_ids=ids, attention_mask=attention).logits, -1)
    with torch.no_grad():
        logq = torch.log_softmax(target(input_ids=ids, attention_mask=attention).logits, -1)
    kl = (logq.exp() * (logq - logp)).sum(-1)
    mask = attention.float()
    return (kl * mask).sum() / mask.sum()


def mean_loss(model: Any, target: Any, data: list[tuple[Any, Any, Any]]) -> float:
    import torch

    model.eval()
    with torch.no_grad():
        losses = [float(loss_of(model, target, *batch)) for batch in data]
    return sum(losses) / len(losses)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("draft", type=Path)
    parser.add_argument("captured", type=Path)
    parser.add_argument("-o", "--output", type=Path, required=True)
    parser.add_argument("--target", type=Path, help="the target, to distil its distribution (recommended)")
    parser.add_argument("--class", dest="traffic_class")
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--batch", type=int, default=1)
    args = parser.parse_args(argv)
    rows = load_rows(args.captured, args.traffic_class)
    if not rows:
        print(f"no captured rows{f' of class {args.traffic_class}' if args.traffic_class else ''} in "
              f"{args.captured}", file=sys.stderr)
        return 2

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    random.seed(0)
    tokenizer = AutoTokenizer.from_pretrained(args.draft)
    model = AutoModelForCausalLM.from_pretrained(args.draft, torch_dtype=torch.float32)
    target = AutoModelForCausalLM.from_pretrained(args.target, torch_dtype=torch.float32).eval() if args.target \
        else None
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    data = batches(rows, args.batch, pad)
    before = mean_loss(model, target, data)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    steps = 0
    for _ in range(args.epochs):
        model.train()
        random.shuffle(data)
        for batch in data:
            loss = loss_of(model, target, *batch)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            steps += 1
    after = mean_loss(model, target, data)
    args.output.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.output)
    tokenizer.save_pretrained(args.output)
    for extra in ("chat_template.jinja", "generation_config.json"):
        if (args.draft / extra).exists() and not (args.output / extra).exists():
            (args.output / extra).write_bytes((args.draft / extra).read_bytes())
    print(json.dumps({"rows": len(rows), "steps": steps, "loss": "kl" if target is not None else "cross-entropy",
                      "loss_before": round(before, 4),
                      "loss_after": round(after, 4), "output": str(args.output)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
