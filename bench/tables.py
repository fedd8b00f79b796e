"""The README's tables, generated from bench/results/*.jsonl: nobody edits the numbers by hand.

    python bench/tables.py            # rewrite the tables in README.md and bench/results/all_runs.md
    python bench/tables.py --check    # exit 1 if any committed table differs from what the logs give

Sources: runs.jsonl (`bash run.sh`, bench/report.py --record), gpu.jsonl (bench/gpu_check.py; or, marked
"measured_elsewhere", runs made elsewhere with its fields), speed.jsonl (bench_speed.py, bench_epoch.py) and,
from scripts in commit 6a6e9b4, time_to_accuracy.jsonl (earlier CPU runs),
ensembles.jsonl and recite.jsonl. README.md shows what `bash run.sh` gives today (todays_table); all_runs.md
every run, by recipe (results_table) and one line each (all_runs_table).
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from research import read_jsonl  # noqa: E402

from config import PRESETS, RunConfig  # noqa: E402

RESULTS = ROOT / "bench" / "results"
README = ROOT / "README.md"
ALL_RUNS = RESULTS / "all_runs.md"

BASELINES = ("london", "vanilla_nopretrain", "ensemble")  # rows the results table shows for one machine
ORDER = ["london", "vanilla_nopretrain", "vanilla", "perceiver", "rope", "ensemble"]
LABELS = {
    "london": "London baseline",
    "vanilla_nopretrain": "vanilla, no pretraining",
    "vanilla": "vanilla",
    "perceiver": "perceiver (m = 64)",
    "rope": "rope",
    "ensemble": "ensemble of the variants (most confident answer)",
}
# The day the perceiver started computing the handout's blocks: earlier perceiver runs are another model.
PERCEIVER_FIXED = "2026-11-26"
ONE_DECODER = "2026-11-28 23:30"  # decoding timed before src/decode.py became one decoder: code gone
DIRECT = {"protocol": "direct", "ceiling": None, "extra": None}
# A research run joins the results table from this many pretraining epochs: shorter ones (one-hour
# budgets, slow hosts, one thread) are not what a two-hour run.sh gives; bench/results/all_runs.md lists them.
MIN_EPOCHS = 80
# A gpu.jsonl run's steps made on a CPU instead (its "cpu_steps"), as all_runs.md marks them.
ON_CPU = {"evaluate": "dev evaluated on a CPU", "reader": "reader trained on a CPU"}
PUBLISHED = "The course's published dev figures for its recipe: vanilla 21.4%, perceiver 17.0%."
DEFAULTS = asdict(RunConfig("pretrain", "vanilla", "wiki.txt"))
CPU_PRETRAIN = {"doc_offset": 0, **DEFAULTS, **PRESETS["cpu"]["pretrain"]}  # 0: a src/ without --doc_offset
CPU_READER = {**DEFAULTS, **PRESETS["cpu"]["reader"]}
TODAYS_READER = (CPU_READER["max_epochs"], CPU_READER["finetune_lr"], CPU_READER["dropout"])
# What a logged cpu run without these fields used: the preset of every run logged before they were.
EARLIER_DOC_OFFSET = 14
EARLIER_READER = {"max_epochs": 5, "learning_rate": 1e-4, "dropout": 0.0}


def todays_cpu_recipe(r: dict) -> bool:
    """A time_to_accuracy run of the cpu recipe, now or before its doc offset changed, run to the end
    of its planned epochs (fixed, or planned to a time budget after the first epoch)."""
    c, f = r["pretrain_config"], r.get("finetune_config", {})
    return (
        "snapshot_of" not in r
        and c.get("optimizer") == "muon"
        and c["batch_size"] == 32
        and c["learning_rate"] == 1e-3
        and r.get("pretrain_doc_offset") in (CPU_PRETRAIN["doc_offset"], EARLIER_DOC_OFFSET)  # cpu_recipe names it
        and (f.get("learning_rate"), f.get("max_epochs")) == (1e-4, 5)
        and "pretrain_trainer_variant" not in r  # research variants of the trainer are not the recipe
        and r.get("pretrain_epochs_done") == c["max_epochs"] >= MIN_EPOCHS
    )


def cpu_recipe(doc_offset: int | None, reader: dict | None) -> str:
    """'cpu', followed by the settings in which a run differs from today's cpu preset: its pretraining's
    doc offset (None: not pretrained) and, for a recite run, its reader's finetune (None: direct)."""
    differences = []
    if doc_offset is not None and doc_offset != CPU_PRETRAIN["doc_offset"]:
        differences.append(f"offset {doc_offset}")
    if reader is not None:
        words = []
        if reader_finetune(reader) != TODAYS_READER:
            rate = f"{reader['learning_rate']:.0e}".replace("e-0", "e-")  # 1e-4
            words.append(f"{reader['max_epochs']} epochs at {rate}")
        if reader.get("examples") is None:  # today's reader trains on the recitations that hold the place
            words.append("on all recitations")
        if not reader.get("copies"):  # today's reader answers with a span of the recitation
            words.append("decoding freely")
        differences += [f"reader {' '.join(words)}"] if words else []
    return ", ".join(["cpu", *differences])


def reader_finetune(reader: dict) -> tuple[int, float, float]:
    """A logged reader's (epochs, learning rate, dropout), as TODAYS_READER spells the preset's."""
    return reader["max_epochs"], reader["learning_rate"], reader["dropout"]


def cpu_reader(r: dict) -> bool:
    """A recite.jsonl line of a cpu-preset reader (no finetune flags but its settings) on a cpu-recipe
    pretraining as long as todays_cpu_recipe asks of a direct row."""
    flags = r.get("finetune_flags")
    settings = ["--finetune_lr", "--dropout", "--max_epochs"]
    return (
        r.get("pretrain_preset") == r.get("preset") == "cpu"
        and flags is not None
        and all(f in settings for f in flags[::2])
        and r["pretrain_epochs"] >= MIN_EPOCHS
    )


def planned_to_budget(r: dict) -> bool:
    """Whether a time_to_accuracy run planned its epochs to a time budget (as run.sh does): not a fixed number."""
    return bool(r["pretrain_config"].get("budget_fit"))


def result_rows() -> list[dict]:
    """Every measured run as {run, protocol, recipe, machine, seed, dev, minutes, epochs (None if not
    pretrained), budget (planned to a time budget), ceiling and extra (recite's, else None)}."""
    rows = []
    pretrained_offset = None  # of the latest pretrained line: the ensemble line of a run.sh follows its own
    for r in read_jsonl(RESULTS / "runs.jsonl"):
        recipe = "handout" if r["run"] == "london" else r["recipe"]
        if "pretrain_epochs" in r:
            pretrained_offset = r.get("pretrain_doc_offset", EARLIER_DOC_OFFSET)
        if recipe == "cpu":
            offset = pretrained_offset if "pretrain_epochs" in r or r["run"] == "ensemble" else None
            recite = r.get("protocol") == "recite"
            reader = r.get("reader", EARLIER_READER) if recite else None
            if reader and (reader_finetune(reader) != TODAYS_READER or reader.get("examples") is None):
                continue  # a reader of an earlier recipe (its finetune, or all recitations): all_runs.md lists it
            recipe = cpu_recipe(offset, reader)
        rows.append({"run": r["run"], "protocol": r.get("protocol", "direct"), "recipe": recipe,
                     "machine": r["machine"], "seed": r["seed"], "dev": r["dev_accuracy"], "minutes": r["minutes"],
                     "epochs": r.get("pretrain_epochs"), "ceiling": r.get("place_in_recitation"),
                     "extra": r.get("extra_minutes"), "budget": r["recipe"] == "cpu", "source": "run.sh"})  # fmt: skip
    pretrainings = {r["name"]: r for r in read_jsonl(RESULTS / "time_to_accuracy.jsonl")}
    for r in read_jsonl(RESULTS / "recite.jsonl"):
        if r.get("protocol") != "recite" or not cpu_reader(r):
            continue
        pretraining = pretrainings.get(r["name"], {})
        reader = {k: r["reader_config"][k] for k in ("max_epochs", "learning_rate", "dropout")}
        reader["examples"], reader["copies"] = r.get("reader_examples"), r.get("reader_copies")
        offset = r.get("pretrain_doc_offset", pretraining.get("pretrain_doc_offset", EARLIER_DOC_OFFSET))
        recipe = cpu_recipe(offset, reader)
        minutes = (r["pretrain_seconds"] + r["reader_seconds"] + r["recite_dev_seconds"]) / 60
        rows.append({"run": r["variant"], "protocol": "recite", "recipe": recipe, "machine": r["machine"],
                     "seed": r["seed"], "dev": r["dev_accuracy"], "minutes": minutes, "epochs": r["pretrain_epochs"],
                     "ceiling": r["place_in_recitation_dev"], "extra": r["extra_minutes"],
                     "budget": bool(pretraining) and planned_to_budget(pretraining)})  # fmt: skip
    for r in read_jsonl(RESULTS / "gpu.jsonl"):
        if r.get("order") != "file" or r.get("pretrain_epochs") != 650:  # only the handout's own trainer
            continue
        minutes = (r["pretrain_seconds"] + r["finetune_seconds"] + r["evaluate_seconds"]) / 60
        protocol = DIRECT
        if r.get("protocol") == "recite":
            protocol = {"protocol": "recite", "ceiling": r["place_in_recitation"], "extra": r["extra_minutes"]}
        rows.append({"run": r["variant"], "recipe": "handout", "machine": f"{r['gpu']} ({r['runs_sharing_device']} runs "
                     "sharing it)", "seed": r["seed"], "dev": r["dev_accuracy"], "minutes": minutes,
                     "epochs": r["pretrain_epochs"], "budget": False, "source": "gpu_check",
                     **protocol})  # fmt: skip
    for r in read_jsonl(RESULTS / "time_to_accuracy.jsonl"):
        if not todays_cpu_recipe(r):
            continue
        if r["variant"] == "perceiver" and r["started"][:10] < PERCEIVER_FIXED:
            continue  # another model than the handout's: bench/results/all_runs.md lists them
        rows.append({"run": r["variant"], "recipe": cpu_recipe(r["pretrain_doc_offset"], None), "machine": r.get("gpu") or r["cpu"],
                     "seed": r["seed"], "dev": r["dev_accuracy"], "minutes": r["total_seconds"] / 60, "epochs": r["pretrain_epochs_done"],
                     "budget": planned_to_budget(r), **DIRECT})  # fmt: skip
    for logged, row in enumerate(rows):
        row["logged"] = logged  # runs.jsonl is in the order the runs ended
    return rows


def short(machine: str) -> str:
    """A machine's description without vendor, trademark signs and filler words, its family and model
    as F/M: "Intel(R) Xeon(R) Processor [family 6, model 167] (AVX512, bf16)" -> "Xeon 6/167 (AVX512, bf16)"."""
    name = re.sub(r"\(R\)|\(TM\)| Processor| CPU", "", machine).strip()
    name = re.sub(r"^(Intel|AMD|NVIDIA) ", "", name)
    return re.sub(r"\[family (\d+), model (\d+)\]", r"\1/\2", name)


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def seed_cells(rows: list[dict]) -> tuple[str, str, str, str, str]:
    """A group of runs' cells, its rows sorted by seed: seeds, dev % per seed, their mean, the recitations'
    ceiling (recite only) and minutes (with what recite adds)."""
    rows.sort(key=lambda r: r["seed"])
    ceiling, minutes = "-", f"{mean([r['minutes'] for r in rows]):.0f}"
    if rows[0]["protocol"] == "recite":
        ceiling = f"{mean([r['ceiling'] for r in rows]) * 100:.1f}%"
        timed = [r["extra"] for r in rows if r["extra"] is not None]  # None: a reader not timed where it ran
        of = "" if len(timed) == len(rows) else f", {len(timed)} of {len(rows)} seeds"
        minutes += f" (+{mean(timed):.1f} recite{of})" if timed else ""
    seeds, per_seed = ", ".join(str(r["seed"]) for r in rows), ", ".join(f"{r['dev'] * 100:.1f}" for r in rows)
    return seeds, per_seed, f"**{mean([r['dev'] for r in rows]) * 100:.1f}**", ceiling, minutes


def results_table() -> str:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for row in result_rows():
        groups[(row["run"], row["protocol"], row["recipe"], short(row["machine"]), row["budget"])].append(row)
    lines = [
        "| run | protocol | recipe | machine | seeds | dev % per seed | mean | place in recitation | minutes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def where(kv: tuple) -> tuple:  # direct rows first, then by run and machine
        run, protocol, _, machine, budget = kv[0]
        return protocol != "direct", ORDER.index(run), machine, budget, run

    for run in BASELINES:  # a baseline's latest machine only (all_runs.md lists every run)
        mine = [key for key in groups if key[0] == run]
        latest = max(mine, key=lambda key: max(r["logged"] for r in groups[key]), default=None)
        for key in mine:
            if key != latest:
                del groups[key]
    for (run, protocol, recipe, machine, budget), rows in sorted(groups.items(), key=where):
        seeds, per_seed, average, ceiling, minutes = seed_cells(rows)
        shown = [f"{r['epochs']:.0f}" for r in rows if r["epochs"] is not None]  # per seed, where pretrained
        if shown:
            recipe = f"{recipe}, {shown[0] if len(set(shown)) == 1 else '/'.join(shown)} epochs"
            recipe += " in a budget" if budget else ""
        lines.append(
            f"| {LABELS[run]} | {protocol} | {recipe} | {machine} | {seeds} | {per_seed} "
            f"| {average} | {ceiling} | {minutes} |"
        )
    return "\n".join(lines) + "\n\n" + PUBLISHED


def plain(machine: str) -> str:
    """A machine in plain words: "AMD EPYC [family 25, model 17] (AVX512, bf16)" -> "AMD EPYC, AVX-512 with
    bf16", "(AVX2, no bf16)" -> "..., AVX2 without bf16"; a GPU's name as it was logged."""
    name = re.sub(r"\(R\)|\(TM\)| Processor| CPU| \[family \d+, model \d+\]", "", machine).strip()
    return name.replace(" (AVX512, bf16)", ", AVX-512 with bf16").replace(" (AVX2, no bf16)", ", AVX2 without bf16")


def todays_table() -> str:
    """The README's table: what `bash run.sh` gives today (the cpu recipe as planned on a CPU, the handout's on a
    GPU), a row per run and protocol, a column per kind of machine, each cell the mean dev % over n seeds."""
    cells: dict[tuple, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for row in result_rows():
        if row["run"] == "ensemble":  # run.sh ran it until recite superseded it (RESEARCH.md, section 12)
            continue
        if row.get("source") in ("run.sh", "gpu_check") and row["recipe"] in ("cpu", "handout"):
            machine = re.sub(r" \(\d+ runs sharing it\)", "", plain(row["machine"]))
            machine += ", handout recipe" if row["source"] == "gpu_check" else ", cpu recipe"
            cells[(row["protocol"] != "direct", ORDER.index(row["run"]), row["run"])][machine].append(row)
    machines = sorted(
        {m for by_machine in cells.values() for m in by_machine}, key=lambda m: (m.endswith("handout recipe"), m)
    )
    lines = [f"| run | protocol | {' | '.join(machines)} |", "|---|---|" + "---|" * len(machines)]
    for (_, _, run), by_machine in sorted(cells.items()):
        protocol = next(iter(by_machine.values()))[0]["protocol"]
        shown = [f"{mean([r['dev'] for r in by_machine[m]]) * 100:.1f} (n={len(by_machine[m])})" if m in by_machine
                 else "-" for m in machines]  # fmt: skip
        lines.append(f"| {LABELS[run]} | {protocol} | {' | '.join(shown)} |")
    return "\n".join(lines) + "\n\n" + PUBLISHED


def seconds(step: dict) -> str:
    """A step's time: hundredths of a second on a CPU, milliseconds on a GPU; its handout MFU where measured."""
    t, mfu = step["seconds_per_step"], f" (MFU {step['handout_mfu']:.0%})" if "handout_mfu" in step else ""
    return (f"{t:.2f} s" if t >= 0.1 else f"{t * 1000:.0f} ms") + mfu


def speed_table() -> str:
    latest: dict[str, dict] = {}
    for r in read_jsonl(RESULTS / "speed.jsonl"):
        if r.get("bench") != "epoch":  # bench_epoch.py's rows: epoch_table
            latest[r["machine"]] = r
    lines = ["| machine | measurement | reference | fast | ratio |", "|---|---|---|---|---|"]
    for machine, r in latest.items():
        one_thread = re.sub(r", (\d+) threads.*", lambda m: ", 1 thread" if m.group(1) == "1" else "", machine)
        name = re.sub(r", torch .*", "", short(one_thread))  # the thread count shown for one thread only
        for t in r.get("train", [])[1::2]:
            ref = next(x for x in r["train"] if x["variant"] == t["variant"] and x["impl"] == "reference")
            fast, ratio = seconds(t), f"{ref['seconds_per_step'] / t['seconds_per_step']:.1f}x"
            for f, how in [(f, "in fp32 (`--fp32`)") for f in r.get("train_fast_fp32", [])] + [
                (f, "compiled (`--compile`)") for f in r.get("train_fast_compiled", [])
            ]:
                if f["variant"] == t["variant"]:
                    fast += f"; {seconds(f)} {how}"
                    ratio += f"; {ref['seconds_per_step'] / f['seconds_per_step']:.1f}x"
            lines.append(
                f"| {name} | pretraining step, {t['variant']}, batch {t['batch_size']} | {seconds(ref)} | {fast} | {ratio} |"
            )
        for e in r.get("eval", []) if r.get("date", "") >= ONE_DECODER else []:
            model = "trained" if e["params"] != "untrained" else "untrained (worst case)"
            same = "identical" if e["identical_predictions"] else "DIFFERENT"
            lines.append(
                f"| {name} | decoding 500 dev questions, {e['variant']}, {model} | {e['reference_seconds']:.1f} s "
                f"| {e['fast_seconds']:.2f} s ({same} answers) | {e['speedup']:.0f}x |"
            )
        if "recite" in r:
            c = r["recite"]
            same = "identical" if c["identical"] else "DIFFERENT"
            lines.append(
                f"| {name} | reciting {c['people']} people, {c['chars']} characters, {c['variant']} | "
                f"{c['reference_seconds_extrapolated']:.0f} s (from {c['reference_people']}) | {c['fast_seconds']:.1f} s "
                f"({same} text) | {c['reference_seconds_extrapolated'] / c['fast_seconds']:.0f}x |"
            )
    return "\n".join(lines)


def epoch_table() -> str:
    """bench_epoch.py's latest rows per machine: a step against the matmul peak, its parts, paired runs."""
    latest: dict[tuple, dict] = {}
    for r in read_jsonl(RESULTS / "speed.jsonl"):
        if r.get("bench") == "epoch":
            latest[(r["cpu_name"], r["preset"], r["variant"], "paired_speedup" in r)] = r
    lines = ["| machine | pretraining step | seconds | GFLOP/s (of the peak) | forward, backward, optimizer |",
             "|---|---|---|---|---|"]  # fmt: skip
    for (machine, preset, variant, paired), r in latest.items():
        parts = ", ".join(f"{r['parts'][p]['share']:.0%}" for p in ("forward", "backward", "optimizer"))
        what = f"{variant}, --preset {preset}, batch {r['batch_size']}"
        seconds = f"{r['seconds_per_step']:.2f} s"
        if paired:
            what += f", micro-batches of {r['micro_batch']}" if r["micro_batch"] else ""
            before, after = (statistics.median(r["paired_seconds"][k]) for k in ("theirs", "ours"))
            seconds = (
                f"{after:.2f} s (before, {r['paired_with']['commit'][:7]}: {before:.2f} s; {r['paired_speedup']:.2f}x)"
            )
        lines.append(f"| {plain(machine)}, {r['threads']} threads | {what} | {seconds} "
                     f"| {r['achieved_gflops']:.0f} ({r['mfu']:.0%} of {r['peak_gflops']:.0f}) | {parts} |")  # fmt: skip
    return "\n".join(lines)


def threads(r: dict) -> str:
    """', 1 thread' for a run logged with its thread count, else ''."""
    return f", {r['threads']} thread{'s' if r['threads'] != 1 else ''}" if "threads" in r else ""


def all_runs_table() -> str:
    """Every logged CPU and GPU run, one line each: the raw record behind bench/RESEARCH.md."""
    lines = [
        "# Every logged run",
        "",
        "## By recipe",
        "",
        "Dev accuracy (500 questions) of every recipe, machine and way of choosing the epochs (a fixed number, or",
        'planned to a time budget as `run.sh` does); "offset 14", "reader ...": how a run differs from today\'s',
        "`cpu` preset. Minutes: a whole run, mean over seeds.",
        "",
        results_table(),
        "",
        "## One line per run",
        "",
        "Generated by `python bench/tables.py` from bench/results/time_to_accuracy.jsonl, gpu.jsonl,",
        "ensembles.jsonl, recite.jsonl and runs.jsonl. Precision: bf16 autocast where the processor has native",
        "bf16 matmuls (or a GPU), else fp32.",
        "",
        "| run | variant | CPU or GPU | precision | seed | recipe | epochs | dev | minutes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    for r in read_jsonl(RESULTS / "time_to_accuracy.jsonl"):
        c = r["pretrain_config"]
        device = (r.get("gpu") or r.get("cpu", "CPU not recorded")) + threads(r)
        precision = "bf16" if (r.get("gpu") or "bf16)" in r.get("cpu", "bf16)")) and c.get("bf16", True) else "fp32"
        recipe = f"{r['preset']}, batch {c['batch_size']}, lr {c['learning_rate']:g}, {c.get('optimizer', 'adamw')}"
        epochs = r.get("pretrain_epochs_done") or c["max_epochs"]
        lines.append(
            f"| {r['name']} | {r['variant']} | {device} | {precision} | {r['seed']} | {recipe} | {epochs:g} "
            f"| {r['dev_accuracy'] * 100:.1f}% | {r['total_seconds'] / 60:.1f} |"
        )
    for r in read_jsonl(RESULTS / "gpu.jsonl"):
        minutes = (r["pretrain_seconds"] + r["finetune_seconds"] + r["evaluate_seconds"]) / 60
        recipe = f"handout, {r.get('order', 'file')} order, decay {r.get('decay', 'all_but_biases')}"
        recipe += "".join(f", {ON_CPU[step]}" for step in r.get("cpu_steps", []))
        name = r["name"] + (f" (measured elsewhere: {r['ran_by']})" if r.get("measured_elsewhere") else "")
        lines.append(
            f"| {name} | {r['variant']} | {r['gpu']} | {r.get('precision', 'bf16').split()[0]} | {r['seed']} | {recipe} | {r['pretrain_epochs']} "
            f"| {r['dev_accuracy'] * 100:.1f}% | {minutes:.1f} |"
        )
    for r in read_jsonl(RESULTS / "ensembles.jsonl"):  # minutes: every member's training + evaluation
        precision = "bf16" if "bf16)" in r["machine"] else "fp32"
        lines.append(
            f"| {r['label']} | {', '.join(r['variants'])} | {r['machine']} | {precision} | - | cpu | - "
            f"| {r['dev_accuracy'] * 100:.1f}% | {r['minutes']:.1f} |"
        )
    for r in read_jsonl(RESULTS / "recite.jsonl"):
        if r.get("protocol") != "recite":  # earlier lines: a research script on AdamW models (RESEARCH.md)
            continue
        minutes = (r["pretrain_seconds"] + r["reader_seconds"] + r["recite_dev_seconds"]) / 60
        reader = r["reader_config"]
        trained_on = r.get("reader_examples") or "all"
        recipe = f"recite, reader {reader['max_epochs']} epochs at {reader['learning_rate']:g} on {trained_on} "
        recipe += f"recitations, {r['recite_chars']} chars"
        precision = "bf16" if "bf16)" in r["machine"] else "fp32"
        lines.append(
            f"| {r['name']} | {r['variant']} | {r['machine']}{threads(r)} | {precision} | {r['seed']} | {recipe} | {r['pretrain_epochs']:g} "
            f"| {r['dev_accuracy'] * 100:.1f}% | {minutes:.1f} |"
        )
    for r in read_jsonl(RESULTS / "runs.jsonl"):
        precision = "bf16" if "bf16)" in r["machine"] else "fp32"
        lines.append(
            f"| run.sh {r['date']}: {r['run']}{' (recite)' if r.get('protocol') == 'recite' else ''} "
            f"| {r['run'].split('_')[0]} | {r['machine']} | {precision} | {r['seed']} "
            f"| {r['recipe']} | {r.get('pretrain_epochs', '-')} | {r['dev_accuracy'] * 100:.1f}% | {r['minutes']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def replace_block(text: str, name: str, body: str) -> str:
    """text with the lines between <!-- name:start --> and <!-- name:end --> replaced by body."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    if start not in text or end not in text:
        raise SystemExit(f"error: README.md has no {start} ... {end} block")
    before, rest = text.split(start, 1)
    _, after = rest.split(end, 1)
    return f"{before}{start}\n{body}\n{end}{after}"


def generated() -> dict[Path, str]:
    readme = README.read_text(encoding="utf-8")
    readme = replace_block(readme, "results", todays_table())
    readme = replace_block(readme, "speed", speed_table())
    readme = replace_block(readme, "epoch", epoch_table())
    return {README: readme, ALL_RUNS: all_runs_table()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="only check that the committed tables are current")
    args = p.parse_args(argv)
    stale = []
    for path, text in generated().items():
        current = path.read_text(encoding="utf-8") if path.is_file() else ""
        if current != text:
            stale.append(path.relative_to(ROOT))
            if not args.check:
                path.write_text(text, encoding="utf-8")
    if args.check and stale:
        print(f"stale: {', '.join(map(str, stale))}; run python bench/tables.py", file=sys.stderr)
        return 1
    print("tables are current" if args.check else f"rewrote {', '.join(map(str, stale)) or 'nothing'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
