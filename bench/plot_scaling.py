"""The figure of bench/bench_scaling.py's rows: a training step's time and memory against the length T.

    python bench/plot_scaling.py                       # the newest run, bench/results/scaling.png
    python bench/plot_scaling.py --machine EPYC --precision fp32

Draws the newest run (the rows of one bench_scaling.py invocation) matching --machine (a part of its label)
and --precision, quick runs only with --quick: step seconds and step memory against T, log-log, a line per
variant, skipped points named below; dashed, the seconds its FLOPs take at the run's matmul peak.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT / "bench"))

from research import read_jsonl  # noqa: E402

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
    """The scaling rows of a JSON-lines file (other benches' rows left out); [] without the file."""
    return [r for r in read_jsonl(path) if r.get("bench") == "scaling"]


def select_run(rows: list[dict], machine: str | None = None, precision: str | None = None, quick: bool = False) -> Run | None:  # fmt: skip
    """The newest run whose machine label contains `machine` and whose precision is `precision` (None: any), as
    a Run of per-variant series sorted by T (skipped points only in `skipped`); None when no run matches."""
    runs = {(r["run"], r["machine"]["label"], r["precision"]) for r in rows if bool(r.get("quick")) == quick}
    runs = {key for key in runs if (machine or "").lower() in key[1].lower() and precision in (None, key[2])}
    if not runs:
        return None
    run_id, name, chosen = newest = max(runs)
    chosen_rows = sorted((r for r in rows if (r["run"], r["machine"]["label"], r["precision"]) == newest),
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
    """The figure of `run` (see the module's docstring), written as a PNG to `out`."""
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
    p.add_argument("--out", type=Path, default=RESULTS / "scaling.png")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    rows = read_rows(args.rows)
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
