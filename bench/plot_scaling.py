"""The figure of bench/bench_scaling.py's rows: a training step's time and memory against the length T.

    python bench/plot_scaling.py                       # the newest run, bench/results/scaling.png
    python bench/plot_scaling.py --machine EPYC --precision fp32

Draws the newest run (the rows of one bench_scaling.py invocation) matching --machine (a part of its label)
and --precision, quick runs only with --quick: step seconds and step memory against T, log-log, a line per
variant, skipped points named below; dashed, the seconds its FLOPs take at the run's matmul peak. A row that is
no JSON object or lacks a field (named with its file and line), an --out it cannot write or no run to draw is
refused in one line, exit code 2, and the figure is written whole or not at all.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT / "src"))

import utils  # noqa: E402
from utils import UserError  # noqa: E402

FORMATS = (".png", ".pdf", ".svg")  # the figure's, by --out's extension
TEXTS = ("run", "date", "precision", "variant")  # a scaling row's fields the figure reads: text,
POSITIVE = ("T", "tokens", "peak_gflops")  # numbers above 0,
MEASURED = ("seconds", "flops", "step_peak_bytes")  # and a measured point's (its memory may be 0)
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


def fits(value: object, kind: str) -> bool:
    """Whether a row's value is of `kind`: "text", "a number above 0" or "a number, at least 0" (finite)."""
    if kind == "text":
        return isinstance(value, str)
    number = type(value) in (int, float) and math.isfinite(value)  # bool is no number here; JSON's NaN is none
    return number and (value > 0 if kind == "a number above 0" else value >= 0)


def row_problem(row: dict) -> str | None:
    """The first field of a scaling row the figure reads that is missing or not of its kind, in words; else None."""
    kinds = {f: "text" for f in TEXTS} | {f: "a number above 0" for f in POSITIVE}
    if "skipped" in row:
        kinds["skipped"] = "text"
    else:
        kinds |= {f: "a number above 0" for f in MEASURED} | {"step_peak_bytes": "a number, at least 0"}
    for name, kind in kinds.items():
        if name not in row:
            return f"field {name} is missing"
        if not fits(row[name], kind):
            return f"field {name} must be {kind}, got {json.dumps(row[name])[:60]}"
    if not isinstance(row.get("machine"), dict) or not fits(row["machine"].get("label"), "text"):
        return "field machine must hold the machine's label as text"
    return None


def read_rows(path: Path) -> list[dict]:
    """The scaling rows of a JSON-lines file (other benches' rows left out); [] without the file. A line that is
    no JSON object, or a scaling row lacking a field the figure reads: a UserError naming file, line and field."""
    if not path.is_file():
        return []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise UserError(f"{path}: not UTF-8 text, so not bench_scaling.py's rows") from None
    rows = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if not isinstance(row, dict):
            raise UserError(f"{path}:{n}: not a JSON object, so not bench_scaling.py's row: {line[:60]!r}")
        if row.get("bench") != "scaling":
            continue
        if (problem := row_problem(row)) is not None:
            raise UserError(f"{path}:{n}: {problem}")
        rows.append(row)
    return rows


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
    try:
        with utils.atomic_path(out) as tmp:  # whole or not at all: savefig writes as it draws
            fig.savefig(tmp, dpi=120, format=out.suffix[1:].lower())
    finally:
        plt.close(fig)
    return out


def check(args: argparse.Namespace) -> None:
    """A one-line UserError for a figure that could not be written or rows that could not be read, before
    anything is read or drawn."""
    utils.check_path_given(args.out, "--out")
    if Path(args.out).suffix.lower() not in FORMATS:
        said = f"its extension is {Path(args.out).suffix!r}" if Path(args.out).suffix else "it has no extension"
        raise UserError(f"--out {args.out}: {said}; the figure is written as {', '.join(FORMATS)}")
    utils.check_output_file(args.out, "--out")
    if os.path.isfile(args.out) and not os.access(args.out, os.W_OK):  # a rename would replace it: refused
        raise UserError(f"--out {args.out}: the file is read-only (permission denied)")
    if importlib.util.find_spec("matplotlib") is None:
        raise UserError("the figure needs matplotlib: pip install matplotlib")
    utils.check_path_given(args.rows, "--rows")
    missing = not os.path.lexists(args.rows)
    utils.check_input(args.rows, "--rows", " (run bench/bench_scaling.py first)" if missing else "")


def main(argv: list[str] | None = None) -> int:
    """0 once the figure is written; 2 after a one-line error, with nothing written."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.error = lambda message: p.exit(2, f"{p.prog}: error: {message} (see --help)\n")  # one line, as run.py's
    p.add_argument("--rows", default=str(RESULTS / "scaling.jsonl"), help="bench_scaling.py's rows")
    p.add_argument("--machine", default=None, help="a part of the machine's label (default: any)")
    p.add_argument("--precision", default=None, choices=["bf16", "fp32"])
    p.add_argument("--quick", action="store_true", help="draw a --quick run")
    p.add_argument("--out", default=str(RESULTS / "scaling.png"), help=f"the figure ({', '.join(FORMATS)})")
    try:
        args = p.parse_args(sys.argv[1:] if argv is None else argv)
        check(args)
        run = select_run(read_rows(Path(args.rows)), args.machine, args.precision, args.quick)
        if run is None:
            raise UserError(f"{args.rows}: no matching run (run bench/bench_scaling.py first)")
        for variant, s in run.series.items():
            for T, why in s.skipped:
                print(f"{variant} T={T}: skipped ({why})")
        if not any(s.T for s in run.series.values()):
            raise UserError(f"{args.rows}: nothing to draw, every point of the run of {run.date} was skipped")
        print(f"wrote {draw(run, Path(args.out))}")
    except SystemExit as e:  # --help, or a usage mistake said in one line
        return int(e.code or 0)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
