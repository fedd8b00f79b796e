"""The figure of bench/bench_scaling.py's rows: a training step's time and memory against the length T.

    python bench/plot_scaling.py                       # the newest run, bench/results/scaling.png
    python bench/plot_scaling.py --machine EPYC --precision fp32
    python bench/plot_scaling.py --list                # the newest run of each machine and precision

Reads bench/results/scaling.jsonl and draws one run (all the rows that one invocation of bench_scaling.py
wrote): the newest of those matching --machine (a part of the machine's label) and --precision; quick runs
only with --quick. Two log-log panels, step seconds and step memory against T, one line per variant
(skipped points left out, and named below the panels), and dashed in the same colour the seconds its FLOP count predicts at the run's
measured matmul peak (flops / peak_gflops). Selecting is `select_run` (plain data); drawing is `draw`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
COLOURS = {"vanilla": "tab:blue", "rope": "tab:orange", "perceiver": "tab:green"}
MARKERS = {"vanilla": "o", "rope": "s", "perceiver": "^"}


@dataclass
class Series:
    """One variant's measured points, sorted by T, and the lengths it skipped with why."""

    T: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    predicted: list[float] = field(default_factory=list)
    memory: list[float] = field(default_factory=list)  # step_peak_bytes
    skipped: list[tuple[int, str]] = field(default_factory=list)


@dataclass
class Run:
    """The rows of one bench_scaling.py run, by variant."""

    machine: str
    precision: str
    date: str
    peak_gflops: float
    tokens: int  # B·T of every point
    series: dict[str, Series]


def read_rows(path: Path) -> list[dict]:
    """The scaling rows of a JSON-lines file (blank lines and other benches' rows left out)."""
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [r for r in rows if r.get("bench") == "scaling"]


def label(row: dict) -> str:
    """The machine a row was measured on, as titles and --machine name it."""
    return row["machine"]["label"]


def runs(rows: list[dict], quick: bool = False) -> dict[tuple[str, str], str]:
    """The newest run id of each (machine, precision), among quick runs or the others."""
    newest: dict[tuple[str, str], str] = {}
    for r in rows:
        if bool(r.get("quick")) == quick:
            key = (label(r), r["precision"])
            newest[key] = max(newest.get(key, r["run"]), r["run"])
    return newest


def select_run(rows: list[dict], machine: str | None = None, precision: str | None = None, quick: bool = False) -> Run | None:  # fmt: skip
    """The newest run whose machine label contains `machine` and whose precision is `precision` (None: any),
    as a Run of per-variant series sorted by T; skipped points only in `skipped`. None when no run matches."""
    candidates = [
        (run_id, key)
        for key, run_id in runs(rows, quick).items()
        if (machine is None or machine.lower() in key[0].lower()) and precision in (None, key[1])
    ]
    if not candidates:
        return None
    run_id, (name, chosen) = max(candidates)
    chosen_rows = sorted((r for r in rows if r["run"] == run_id and label(r) == name and r["precision"] == chosen),
                         key=lambda r: r["T"])  # fmt: skip
    series: dict[str, Series] = {}
    for r in chosen_rows:
        s = series.setdefault(r["variant"], Series())
        if "skipped" in r:
            s.skipped.append((r["T"], r["skipped"]))
            continue
        s.T.append(r["T"])
        s.seconds.append(r["seconds"])
        s.predicted.append(r["flops"] / (r["peak_gflops"] * 1e9))
        s.memory.append(r["step_peak_bytes"])
    first = chosen_rows[0]
    return Run(name, chosen, first["date"], first["peak_gflops"], first["tokens"], series)


def leading_digit(y: float) -> int:
    """The first significant digit of y > 0 (which minor ticks of a log axis get a label)."""
    return round(y / 10 ** math.floor(math.log10(y)))


def draw(run: Run, out: Path) -> Path:
    """Two log-log panels, step time and step memory against T, one line per variant; the predicted seconds
    dashed. Written as a PNG to `out`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FormatStrFormatter, FuncFormatter

    fig, (time_ax, memory_ax) = plt.subplots(1, 2, figsize=(11, 4.8))
    lengths = sorted({T for s in run.series.values() for T in s.T})
    for variant, s in run.series.items():
        if not s.T:
            continue
        style = {"color": COLOURS.get(variant), "marker": MARKERS.get(variant, "o")}
        time_ax.plot(s.T, s.seconds, "-", **style, label=variant)
        time_ax.plot(s.T, s.predicted, "--", color=style["color"], alpha=0.7, label=f"{variant}: its FLOPs at peak")
        memory_ax.plot(s.T, [b / 1e9 for b in s.memory], "-", **style, label=variant)
    for ax, what in ((time_ax, "seconds per training step"), (memory_ax, "step memory, GB (peak over baseline)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(lengths, [str(T) for T in lengths])
        ax.xaxis.set_minor_locator(plt.NullLocator())
        ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda y, _: f"{y:g}" if leading_digit(y) in (2, 3, 5) else ""))
        ax.tick_params(axis="y", which="minor", labelsize=7)
        ax.set_xlabel(f"sequence length T (batch {run.tokens} / T)")
        ax.set_ylabel(what)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{run.machine}, {run.precision}, {run.date} (matmul peak {run.peak_gflops:.0f} GFLOP/s)")
    skipped = [f"{v} T={T}: {why}" for v, s in run.series.items() for T, why in s.skipped]
    if skipped:
        fig.text(0.01, 0.01, "skipped: " + "; ".join(skipped), fontsize=7, wrap=True)
    fig.tight_layout(rect=(0, 0.05 if skipped else 0, 1, 1))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=Path, default=RESULTS / "scaling.jsonl", help="bench_scaling.py's rows")
    p.add_argument("--machine", default=None, help="a part of the machine's label (default: any)")
    p.add_argument("--precision", default=None, choices=["bf16", "fp32"])
    p.add_argument("--quick", action="store_true", help="draw a --quick run")
    p.add_argument("--list", action="store_true", help="print the newest run of each machine and precision")
    p.add_argument("--out", type=Path, default=RESULTS / "scaling.png")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    rows = read_rows(args.rows) if args.rows.is_file() else []
    if args.list:
        for (name, precision), run_id in sorted(runs(rows, args.quick).items()):
            print(f"{run_id}  {precision}  {name}")
        return 0
    run = select_run(rows, args.machine, args.precision, args.quick)
    if run is None:
        print(f"{args.rows}: no matching run (run bench/bench_scaling.py first)", file=sys.stderr)
        return 1
    for variant, s in run.series.items():
        for T, why in s.skipped:
            print(f"{variant} T={T}: skipped ({why})")
    print(f"wrote {draw(run, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
