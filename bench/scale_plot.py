"""docs/scale.svg from ``bench/scale.py --json`` files: per K, each phase's seconds and etcd's CPU
seconds, on log-log axes beside the line of linear growth (matplotlib: ``pip install matplotlib``).

    python bench/scale_plot.py RESULTS.json [MORE.json ...] [--out docs/scale.svg]
"""

from __future__ import annotations

import argparse
import json

PHASES = {"first": "first round", "leave": "one node leaves", "rack": "a rack lost", "late": "10 % join late"}


def load(paths: list[str]) -> dict[int, dict]:
    """Every K's phases; a later file's K replaces an earlier one's."""
    results: dict[int, dict] = {}
    for path in paths:
        with open(path) as handle:
            results.update({int(k): v for k, v in json.load(handle).items()})
    return dict(sorted(results.items()))


def plot(results: dict[int, dict], out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (seconds, cpu) = plt.subplots(1, 2, figsize=(10, 4), sharex=True)
    sizes = list(results)
    for key, label in PHASES.items():
        points = [(k, r[key]) for k, r in results.items() if key in r]
        if not points:
            continue
        ks = [k for k, _ in points]
        seconds.plot(ks, [p["seconds"] for _, p in points], marker="o", label=label)
        cpu.plot(ks, [p["etcd_cpu"] for _, p in points], marker="o", label=label)
    for axes, title in ((seconds, "round seconds (this machine's harness)"), (cpu, "etcd CPU seconds (one core)")):
        low = min(line.get_ydata()[0] for line in axes.get_lines())
        axes.plot(sizes, [low * k / sizes[0] for k in sizes], linestyle=":", color="grey", label="linear in K")
        axes.set_xscale("log", base=2)
        axes.set_yscale("log")
        axes.set_xlabel("nodes (K)")
        axes.set_title(title, fontsize=10)
        axes.grid(True, which="both", alpha=0.3)
    seconds.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(out, format="svg", metadata={"Date": None})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+")
    parser.add_argument("--out", default="docs/scale.svg")
    args = parser.parse_args()
    plot(load(args.results), args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
