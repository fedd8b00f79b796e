"""Speed: the course's plain code (bench/course.py, the "reference") against src's fast path, in one run.

    python bench/bench_speed.py                 # train and eval (under 10 minutes on 2 cores)
    python bench/bench_speed.py --parts train   # train | eval | recite
    python bench/bench_speed.py --parts recite --pretrained RUN/pretrain.params   # recitation
    python bench/bench_speed.py --parts eval --trained_only --trained RUN/finetune.params   # a trained model only

train: a pretraining step per variant at the handout's settings, the handout's loop (fp32, DataLoader, torch's
AdamW) against run.py's Trainer. eval: greedy answers to the 500 dev questions, one at a time with the prefix
recomputed against batched with KV caches. recite: 100 characters for each of the 2,000 training people
(one at a time: 20 people, extrapolated). Writes --out (JSON) and appends it to --jsonl (the README's table).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from itertools import chain, count
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))  # research.py, course.py (which put src/ on the path)

import course  # noqa: E402
from research import VARIANTS, append_jsonl, count_flops, machine_name, matmul_gflops, synchronize  # noqa: E402

import machine  # noqa: E402
from dataset import MASK_CHAR, PAD_CHAR, CharCorruptionDataset, read_questions, read_text  # noqa: E402
from decode import continue_text, predict  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from recite import recitation_prompt  # noqa: E402
from trainer import Trainer, TrainerConfig  # noqa: E402
from utils import write_json_atomic  # noqa: E402

DATA = ROOT / "data"
CPU = torch.device("cpu")


def model_for(variant: str, vocab_size: int, device: torch.device = CPU) -> GPT:
    """src's GPT at the handout's size (perceiver m = 64), seeded: every call starts from the same parameters."""
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=vocab_size, variant=variant, bottleneck_dim=64)
    return GPT(cfg).to(device)


def handout_step_gflop(variant: str, vocab_size: int, batch: int, device: torch.device) -> float:
    """GFLOP of a handout step, forward with the loss and backward, on (batch, 127) examples; any precision's."""
    x = torch.randint(1, vocab_size, (batch, 127), device=device)
    return count_flops(model_for(variant, vocab_size, device), x, x) / 1e9


def peak_gflops(device: torch.device, bf16: bool) -> float:
    """The matmul rate an MFU is measured against: a square matmul in the training precision, large enough
    to keep the device busy."""
    size = 8192 if device.type == "cuda" else 2048
    return matmul_gflops(size, size, size, torch.bfloat16 if bf16 else torch.float32, device)


def train_throughput(
    ds: CharCorruptionDataset, variant: str, path: str, steps: int, batch: int, device: torch.device,
    fp32: bool = False, compile: bool = False, gflop: float = 0.0, peak: float = 0.0,
) -> dict:  # fmt: skip
    """A row of the results file: `steps` optimizer steps at the handout's settings after warm-up (2 steps;
    compiled, a whole epoch, which compiles both batch shapes), path "reference" the handout's model and loop
    (bench/course.py), "fast" run.py's Trainer (`compile`: with --compile), in the precision training would use
    (machine.choose; fp32 as --fp32 trains). With `gflop` (handout_step_gflop) and `peak` (GFLOP/s) also its MFU:
    the handout's FLOPs of a step (full-width examples) over its time and that peak: past 100% where cropping
    skipped padding."""
    precision = machine.choose(device, fp32, say=False)["precision"]
    model = model_for(variant, ds.vocab_size, device)
    cfg = TrainerConfig(max_epochs=10**6, batch_size=batch, learning_rate=6e-3, precision=precision, compile=compile)
    warm = -(-len(ds) // batch) + 1 if compile else 2
    if path == "reference":
        model = course.course_copy(model)
        optimizer = course.optimizer(model, cfg)
        batches = chain.from_iterable(course.batches(ds, batch) for _ in count())  # epoch after epoch
        step = lambda x, y: course.train_step(model, optimizer, x, y, cfg.grad_norm_clip)  # noqa: E731
    else:
        trainer = Trainer(model, ds, cfg, device)
        batches = chain.from_iterable(map(trainer.batches, count()))  # epochs 0, 1, ..., each order seeded
        step = trainer.optimize
    model.train()
    real_tokens, examples, t_start = 0, 0, None
    for i in range(steps + warm):
        if i == warm:
            synchronize(device)
            t_start = time.perf_counter()
        x, y = next(batches)
        step(x.to(device), y.to(device))
        if i >= warm:
            real_tokens += int((y != 0).sum())
            examples += x.size(0)
    synchronize(device)  # CUDA runs ahead of Python: count the steps' kernels, not their launches
    seconds = time.perf_counter() - t_start
    row = {
        "variant": variant,
        "impl": path,  # the results' key (bench/tables.py reads it)
        "bf16": precision == "bf16" and path == "fast",
        "compiled": compile,
        "steps": steps,
        "batch_size": batch,
        "seconds_per_step": seconds / steps,
        "real_tokens_per_s": real_tokens / seconds,
        "handout_tokens_per_s": examples * ds.example_length / seconds,
    }
    if gflop and peak:
        mfu = gflop / row["seconds_per_step"] / peak
        row |= {"handout_gflop_per_step": gflop, "peak_gflops": peak, "handout_mfu": mfu}
    return row


def eval_speed(ds: CharCorruptionDataset, variant: str, params: Path | None = None) -> dict:
    """Decode the 500 dev questions with the handout's model and loop and with src's, from the same parameters:
    untrained (params None) the fast decoder runs every row to 32 characters, its worst case; trained (params: a
    finetuned params file) it stops rows early, as in real use."""
    questions = [q.text for q in read_questions(DATA / "birth_dev.tsv", require_place=False) if q]
    out = {"variant": variant, "lines": len(questions), "params": str(params) if params else "untrained"}
    preds = {}
    threads = torch.get_num_threads()
    model = model_for(variant, ds.vocab_size)
    if params is not None:
        model.load_state_dict(torch.load(params, weights_only=True))
    decoders = {"reference": (course.predict, course.course_copy(model)), "fast": (predict, model)}
    for path, (decode, decoding_model) in decoders.items():
        # One line at a time is far faster on one thread here (2 threads: ~70x slower per line), so
        # the reference gets its best setting; the batched decoder uses every thread.
        torch.set_num_threads(1 if path == "reference" else threads)
        t0 = time.perf_counter()
        preds[path] = decode(decoding_model, ds.vocab, questions, CPU)
        out[f"{path}_seconds"] = time.perf_counter() - t0
    torch.set_num_threads(threads)
    out["identical_predictions"] = preds["reference"] == preds["fast"]
    out["speedup"] = out["reference_seconds"] / out["fast_seconds"]
    return out


@torch.no_grad()
def recite_one_at_a_time(model: GPT, vocab, prompt: str, length: int) -> str:
    """One prompt recited, the prefix recomputed for every character, MASK and PAD never chosen (what
    decode.continue_text computes in batches with KV caches)."""
    ids = torch.tensor([vocab.encode(prompt)])
    while ids.size(1) < length:
        logits = model(ids)[0][0, -1]
        logits[[vocab.stoi[MASK_CHAR], vocab.stoi[PAD_CHAR]]] = float("-inf")
        ids = torch.cat([ids, logits.argmax().view(1, 1)], dim=1)
    return vocab.decode(ids[0, :length].tolist())


def recite_speed(ds: CharCorruptionDataset, pretrained: Path, chars: int, reference_people: int) -> dict:
    """Recite the 2,000 training people from pretrained params in batches with KV caches, and the first
    `reference_people` one at a time (recite_one_at_a_time), extrapolated to all."""
    side = json.loads(Path(f"{pretrained}.json").read_text())
    model = model_for(side["variant"], ds.vocab_size)
    model.load_state_dict(torch.load(pretrained, weights_only=True))
    questions = [q for q in read_questions(DATA / "birth_places_train.tsv", require_place=True) if q]
    prompts = [recitation_prompt(q.text, "train") for q in questions]
    t0 = time.perf_counter()
    fast = continue_text(model, ds.vocab, prompts, chars, [MASK_CHAR, PAD_CHAR], CPU)
    fast_seconds = time.perf_counter() - t0
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one line at a time is fastest on one thread (see eval_speed)
    t0 = time.perf_counter()
    plain = [recite_one_at_a_time(model, ds.vocab, p, chars) for p in prompts[:reference_people]]
    reference_seconds = (time.perf_counter() - t0) / reference_people * len(prompts)
    torch.set_num_threads(threads)
    return {"variant": side["variant"], "params": str(pretrained), "people": len(prompts), "chars": chars,
            "fast_seconds": fast_seconds, "reference_seconds_extrapolated": reference_seconds,
            "reference_people": reference_people, "identical": plain == fast[:reference_people]}  # fmt: skip


def speed_line(what: str, ref: dict | None, fast: dict) -> str:
    """A table line of a training step: the reference's and the fast path's time, rate and MFU, and their ratio."""

    def cell(r: dict) -> str:
        mfu = f", MFU {r['handout_mfu']:.1%}" if "handout_mfu" in r else ""
        return f"{r['seconds_per_step'] * 1e3:.1f} ms/step, {r['handout_tokens_per_s']:,.0f} tok/s{mfu}"

    ratio = f"{ref['seconds_per_step'] / fast['seconds_per_step']:.1f}x" if ref else "-"
    return f"| {what} | {cell(ref) if ref else '-'} | {cell(fast)} | {ratio} |"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", nargs="+", default=["train", "eval"], help="train, eval (default), recite")
    p.add_argument("--ref_steps", type=int, default=4, help="timed reference-path steps per variant")
    p.add_argument("--fast_steps", type=int, default=20, help="timed fast-path steps per variant")
    p.add_argument("--batch_size", type=int, default=128, help="pretraining batch size (handout: 128)")
    p.add_argument("--trained", type=Path, nargs="*", default=[], help="finetuned params to also decode with")
    p.add_argument("--trained_only", action="store_true", help="not also the untrained models (slow: 5 min each)")
    p.add_argument("--pretrained", type=Path, default=None, help="--parts recite: pretrained params to recite with")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS, help="--parts train: which")
    p.add_argument("--fp32", action="store_true", help="--parts train: also time the fast path without bf16")
    p.add_argument("--compile", action="store_true", help="--parts train: also time the fast path with --compile")
    p.add_argument("--device", default="cpu", help="--parts train: cpu or cuda (the other parts run on the CPU)")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "speed.json", help="JSON output")
    p.add_argument("--jsonl", type=Path, default=ROOT / "bench" / "results" / "speed.jsonl", help="appended to")
    args = p.parse_args()
    device = torch.device(args.device)
    random.seed(0)
    np.random.seed(0)
    ds = CharCorruptionDataset(read_text(DATA / "wiki.txt"), 128)
    threads = "" if device.type == "cuda" else f", {torch.get_num_threads()} threads"
    result: dict = {"machine": f"{machine_name(device)}{threads}, torch {torch.__version__}"}
    result["date"] = time.strftime("%Y-%m-%d %H:%M")
    lines = []
    if "train" in args.parts:
        precision = machine.choose(device, say=False)["precision"]  # the fast path's; the reference trains in fp32
        peak = {name: peak_gflops(device, name == "bf16") for name in {"fp32", precision}}
        result["train"] = []
        for variant in args.variants:
            gflop = handout_step_gflop(variant, ds.vocab_size, args.batch_size, device)  # once a variant, every row's
            common = {"batch": args.batch_size, "device": device, "gflop": gflop}
            ref = train_throughput(ds, variant, "reference", args.ref_steps, **common, peak=peak["fp32"])
            f = train_throughput(ds, variant, "fast", args.fast_steps, **common, peak=peak[precision])
            result["train"] += [ref, f]
            # kept apart from the reference/fast pairs the README's table reads
            for name, how in [("fp32", {"fp32": True})] * args.fp32 + [("compiled", {"compile": True})] * args.compile:
                try:  # a compiler that fails here must not cost the figures already measured
                    o = train_throughput(ds, variant, "fast", args.fast_steps, **common, **how,
                                         peak=peak["fp32" if name == "fp32" else precision])  # fmt: skip
                except Exception as e:  # noqa: BLE001
                    print(f"train {variant}, fast path {name}: failed ({type(e).__name__}: {e})"[:500], flush=True)
                    continue
                result.setdefault(f"train_fast_{name}", []).append(o)
                lines.append(speed_line(f"train {variant}, batch {args.batch_size}, fast path {name}", None, o))
            lines.append(speed_line(f"train {variant}, batch {args.batch_size}", ref, f))
    if "eval" in args.parts:
        result["eval"] = []
        cases = [] if args.trained_only else [(v, None) for v in VARIANTS]
        cases += [(json.loads(Path(f"{p}.json").read_text())["variant"], p) for p in args.trained]
        for variant, params in cases:
            e = eval_speed(ds, variant, params)
            result["eval"].append(e)
            model = f"{variant}, trained ({params.parent.name})" if params else f"{variant}, untrained"
            lines.append(
                f"| decode 500 dev lines, {model} | {e['reference_seconds']:.1f} s | {e['fast_seconds']:.2f} s "
                f"(identical: {e['identical_predictions']}) | {e['speedup']:.0f}x |"
            )
    if "recite" in args.parts:
        if args.pretrained is None:
            sys.exit("error: --parts recite needs --pretrained PARAMS")
        r = recite_speed(ds, args.pretrained, 100, 20)
        result["recite"] = r
        lines.append(
            f"| recite {r['people']} people, {r['chars']} characters, {r['variant']} | {r['reference_seconds_extrapolated']:.0f} s "
            f"(from {r['reference_people']}) | {r['fast_seconds']:.1f} s (identical: {r['identical']}) | "
            f"{r['reference_seconds_extrapolated'] / r['fast_seconds']:.0f}x |"
        )
    table = "| measurement | reference | fast | ratio |\n|---|---|---|---|\n" + "\n".join(lines)
    result["table"] = table
    write_json_atomic(args.out, result)
    append_jsonl(args.jsonl, [{k: v for k, v in result.items() if k != "table"}])
    print(f"{result['machine']}, {result['date']}\n\n{table}\n\nwritten to {args.out}")


if __name__ == "__main__":
    main()
