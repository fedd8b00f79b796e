"""Recite, then answer: the pretrained model first writes the person's biography from memory, then reads it.

    python bench/recite_then_answer.py vanilla bench/runs/vanilla_cpu_ctx_seed1/pretrain.params
    python bench/recite_then_answer.py perceiver bench/runs/NAME/pretrain.params --chars 48

The handout asks the question directly ("Where was Ada Lovelace born?" + MASK
-> place). Here each answer takes two steps, and the facts still come only
from the pretrained parameters:

1. recite: the pretrained model continues "Ada Lovelace." greedily, as it
   learned to continue documents in pretraining, until its first MASK; the
   first --chars characters are kept. This is done for every training and dev
   question, with no place given.
2. read: the pretrained model is finetuned (run.py finetune, the handout's 10
   epochs) on the training questions with their recitation in place of the
   question ("<recitation> MASK place MASK", loss on the answer only), and
   evaluated on the dev recitations (run.py evaluate).

So the reader learns to find a birth place in a text, and the text is what the
model remembers. The score is printed and appended to
bench/results/recite.jsonl with how many dev recitations contain the gold
place (the ceiling of a reader that copies). The perceiver's outputs see only
its first m = 64 inputs, so its answer must end within them: use --chars 48.
Recipe from Sun et al., "Recitation-Augmented Language Models" (ICLR 2023).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from time_to_accuracy import timed  # noqa: E402

from confidence import person_name  # noqa: E402
from dataset import MASK_CHAR, PAD_CHAR, CharCorruptionDataset, Vocabulary, read_questions, read_text  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from run import BLOCK_SIZE, next_logits_fn  # noqa: E402
from utils import evaluate_places, greedy_decode_batch, torch_load_safe  # noqa: E402

NextLogits = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None"], torch.Tensor]
RESULTS = ROOT / "bench" / "results" / "recite.jsonl"
LONGEST_PLACE = 15  # characters, in the training set (13 in dev)


def recitation_text(prompt: str, continuation: str, max_chars: int) -> str:
    """prompt + continuation as one TSV field of at most max_chars characters: no tabs or newlines."""
    return (prompt + continuation).replace("\t", " ").replace("\n", " ")[:max_chars]


def without(next_logits: NextLogits, ids: list[int]) -> NextLogits:
    """next_logits (see greedy_decode_batch) that never chooses any of `ids`."""

    def wrapped(tokens: torch.Tensor, lengths: torch.Tensor, kept: torch.Tensor | None) -> torch.Tensor:
        logits = next_logits(tokens, lengths, kept)
        logits[:, ids] = float("-inf")
        return logits

    return wrapped


@torch.no_grad()
def recite(model: GPT, vocab: Vocabulary, prompts: list[str], max_chars: int, batch: int = 256) -> list[str]:
    """Greedy continuation of each prompt (e.g. "Ada Lovelace.") to max_chars characters -> recitation_text.

    MASK and PAD are never chosen: span corruption taught the model to close a
    document's prefix with a MASK at any point, which would end the recitation.
    """
    model.eval()
    special = [vocab.stoi[MASK_CHAR], vocab.stoi[PAD_CHAR]]
    encoded = [vocab.encode(p, where="a recitation prompt") for p in prompts]
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))  # similar lengths share a batch
    out = [""] * len(encoded)
    for start in range(0, len(order), batch):
        rows = order[start : start + batch]
        text_only = without(next_logits_fn(model), special)  # fresh KV caches for each batch
        prompt_ids = [encoded[i] for i in rows]
        new = max_chars - len(prompt_ids[0])  # the shortest prompt of the batch needs the most
        continued = greedy_decode_batch(text_only, prompt_ids, new, -1, BLOCK_SIZE - 1, torch.device("cpu"))
        for i, ids in zip(rows, continued, strict=True):
            out[i] = recitation_text(prompts[i], vocab.decode(ids), max_chars)
    return out


def recitation_prompt(question: str) -> str:
    """ "Where was Ada Lovelace born?" -> "Ada Lovelace.", how the person's document starts."""
    name = person_name(question)
    return f"{name}." if name else question


def load_pretrained(variant: str, path: Path, vocab_size: int) -> GPT:
    state = torch_load_safe(path)
    m = state["down_block.C"].size(1) if "down_block.C" in state else 32
    model = GPT(GPTConfig(vocab_size=vocab_size, perceiver=variant == "perceiver", bottleneck_dim=m))
    model.load_state_dict(state)
    model.set_impl("fast")
    return model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("variant", choices=["vanilla", "perceiver"], help="model variant of the params")
    p.add_argument("params", type=Path, help="pretrained params (run.py pretrain --writing_params_path)")
    p.add_argument("--chars", type=int, default=100, help="recitation characters kept (perceiver, m = 64: 48)")
    p.add_argument("--finetune_lr", type=float, default=6e-4, help="reader finetuning rate (the handout's)")
    p.add_argument("--dropout", type=float, default=0.1, help="reader finetuning dropout (the handout's)")
    p.add_argument("--epochs", type=int, default=10, help="reader finetuning epochs (the handout's)")
    p.add_argument("--seed", type=int, default=0, help="run.py --seed for the finetuning")
    p.add_argument("--name", default=None, help="work folder bench/runs/recite/NAME (default: the params' folder)")
    args = p.parse_args()
    if not 8 <= args.chars <= BLOCK_SIZE - 3 - LONGEST_PLACE:
        sys.exit(f"error: --chars must be between 8 and {BLOCK_SIZE - 3 - LONGEST_PLACE} (room for the answer)")
    if not args.params.is_file():
        sys.exit(f"error: no params file {args.params}")
    name = args.name or args.params.parent.name
    work = ROOT / "bench" / "runs" / "recite" / name
    work.mkdir(parents=True, exist_ok=True)
    vocab = CharCorruptionDataset(read_text(ROOT / "data" / "wiki.txt"), BLOCK_SIZE).vocab
    model = load_pretrained(args.variant, args.params, len(vocab))

    record: dict = {"params": str(args.params), "variant": args.variant, "chars": args.chars}
    record |= {"finetune_lr": args.finetune_lr, "dropout": args.dropout, "epochs": args.epochs, "seed": args.seed}
    record["started"] = time.strftime("%Y-%m-%d %H:%M")
    t0 = time.time()
    for split in ("birth_places_train.tsv", "birth_dev.tsv"):
        questions = [q for q in read_questions(ROOT / "data" / split, require_place=True) if q is not None]
        recited = recite(model, vocab, [recitation_prompt(q.text) for q in questions], args.chars)
        (work / split).write_text("".join(f"{r}\t{q.place}\n" for r, q in zip(recited, questions, strict=True)))
        share = sum(q.place in r for r, q in zip(recited, questions, strict=True)) / len(questions)
        record[f"place_in_recitation_{'train' if 'train' in split else 'dev'}"] = round(share, 4)
    record["recite_seconds"] = round(time.time() - t0, 1)

    run = [sys.executable, "src/run.py"]
    common = [args.variant, "wiki.txt", "--seed", str(args.seed), "--tb_expt_name", "recite"]
    common += ["--bottleneck_dim", "64"] if args.variant == "perceiver" else []
    reader = work / "reader.params"
    finetune = ["finetune", *common, "--reading_params_path", str(args.params), "--writing_params_path", str(reader),
                "--finetune_corpus_path", str(work / "birth_places_train.tsv"), "--finetune_lr",
                str(args.finetune_lr), "--dropout", str(args.dropout), "--max_epochs", str(args.epochs),
                "--batch_size", "256"]  # fmt: skip
    evaluate = ["evaluate", *common, "--reading_params_path", str(reader), "--eval_corpus_path",
                str(work / "birth_dev.tsv"), "--outputs_path", str(work / "dev.predictions")]  # fmt: skip
    record["finetune_seconds"] = round(timed(run + finetune, work / "finetune.log")[0], 1)
    record["evaluate_seconds"] = round(timed(run + evaluate, work / "evaluate.log")[0], 1)
    # Scored against the original dev file, so the recitation files cannot change what counts as correct.
    predictions = (work / "dev.predictions").read_text(encoding="utf-8").splitlines()
    total, correct = evaluate_places(ROOT / "data" / "birth_dev.tsv", predictions)
    record["dev_accuracy"] = correct / total
    with open(RESULTS, "a") as f:
        f.write(json.dumps(record) + "\n")
    print(
        f"{args.params}: recite {record['recite_seconds']:.0f} s (dev place in the recitation: "
        f"{record['place_in_recitation_dev']:.1%}), finetune {record['finetune_seconds']:.0f} s, evaluate "
        f"{record['evaluate_seconds']:.0f} s: dev accuracy {record['dev_accuracy']:.1%} ({correct:g} of {total:g})"
    )


if __name__ == "__main__":
    main()
