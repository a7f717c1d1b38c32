"""Figures from a benchmark's JSON lines: ./x bench NAME --plot writes the run's JSON lines to
out/bench/NAME.jsonl and calls this script, which writes PNGs beside them (matplotlib, Agg).

  collectives  busbw vs message size per backend and rank count, one figure per collective, with
               the memcpy bandwidth measured in the same run as a line
  python       per-op time: the engine, PyTorch's DTensor and plain tensors (same run), and the
               TP linear step against PyTorch's
  redistribute redistribute vs the bare collective it runs, per case, against bytes
  checkpoint   save/load throughput against dd's, per layout
  serve        tokens/s vs concurrency, per model and rank count
  fsdp         training state per rank and time per step: FSDP, replicated, PyTorch's FSDP2, one
               process

Usage: tools/plot_bench.py NAME FILE.jsonl OUT_DIR   (prints the PNGs it wrote)
"""

import collections
import json
import os
import statistics
import sys


def rows_of(path, name):
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if row.get("bench") in (name, name + "_cuda"):
                rows.append(row)
    return rows


def _figure(title, xlabel, ylabel, logx=False):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if logx:
        ax.set_xscale("log", base=2)
    ax.grid(True, alpha=0.3)
    return fig, ax


def _save(fig, out_dir, stem, written):
    path = os.path.join(out_dir, stem + ".png")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    written.append(path)


def plot_collectives(rows, out_dir, written):
    memcpy = [r["memcpy_gbs"] for r in rows if r.get("op") == "memcpy"]
    series = collections.defaultdict(list)
    for r in rows:
        if "busbw_gbs" in r:
            series[(r["op"], r["backend"], r["ranks"])].append((r["bytes"], r["busbw_gbs"]))
    for op in sorted({k[0] for k in series}):
        fig, ax = _figure(f"{op}: bus bandwidth", "message size (bytes)", "busbw (GB/s)", True)
        for (o, backend, ranks), pts in sorted(series.items()):
            if o != op:
                continue
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                    label=f"{backend}, {ranks} ranks")
        if memcpy:
            ax.axhline(statistics.median(memcpy), color="gray", linestyle="--",
                       label="memcpy (same run)")
        ax.legend(fontsize=8)
        _save(fig, out_dir, f"collectives_{op}", written)


def plot_python(rows, out_dir, written):
    per_call = [r for r in rows if "pytorch_us" in r and "mesh" in r]
    if per_call:
        import numpy as np

        device = per_call[0].get("device", "cpu")
        fig, ax = _figure(f"per call on a 1-rank {device} mesh", "op", "µs per call")
        x = np.arange(len(per_call))
        width = 0.27
        for k, (key, label) in enumerate((("dtensor_us", "dtensor (this engine)"),
                                          ("pytorch_us", "PyTorch's DTensor"),
                                          ("local_us", "plain tensors"))):
            ax.bar(x + (k - 1) * width, [r[key] for r in per_call], width, label=label)
        ax.set_xticks(x, [r["op"] for r in per_call])
        ax.legend(fontsize=8)
        _save(fig, out_dir, f"python_per_call_{device}", written)
    step = [r for r in rows if r.get("op") == "tp_linear_step"]
    if step:
        r = step[-1]
        fig, ax = _figure(f"TP linear step, {r['ranks']} processes", "", "µs per step")
        ax.bar(["dtensor (shm)", "PyTorch's DTensor (Gloo)"], [r["dtensor_us"], r["pytorch_us"]],
               color=["C0", "C1"])
        _save(fig, out_dir, "python_tp_linear_step", written)


def plot_redistribute(rows, out_dir, written):
    series = collections.defaultdict(list)
    for r in rows:
        if "redistribute_us" in r:
            series[(r["case"], r["backend"], r["ranks"])].append(
                (r["bytes"], r["redistribute_us"], r["collective_us"]))
    if not series:
        return
    fig, ax = _figure("redistribute vs the bare collective", "bytes", "µs", True)
    ax.set_yscale("log")
    for k, ((case, backend, ranks), pts) in enumerate(sorted(series.items())):
        pts.sort()
        color = f"C{k % 10}"
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=color,
                label=f"{case} ({backend}, {ranks})")
        ax.plot([p[0] for p in pts], [p[2] for p in pts], linestyle=":", color=color)
    ax.legend(fontsize=7, title="solid: redistribute, dotted: collective", title_fontsize=7)
    _save(fig, out_dir, "redistribute", written)


def plot_checkpoint(rows, out_dir, written):
    rows = [r for r in rows if "gbs" in r]
    if not rows:
        return
    fig, ax = _figure("checkpoint throughput against dd", "", "GB/s")
    labels = [f"{r['op']} {r['bytes'] // 2**20} MiB\n{r['layout']}, {r['ranks']} ranks"
              if "bytes" in r else f"{r['op']}\n{r['layout']}, {r['ranks']} ranks" for r in rows]
    import numpy as np

    x = np.arange(len(rows))
    ax.bar(x - 0.2, [r["gbs"] for r in rows], 0.4, label="dtensor.checkpoint")
    ax.bar(x + 0.2, [r["dd_gbs"] for r in rows], 0.4, label="dd (same run)")
    ax.set_xticks(x, labels, fontsize=7)
    ax.legend(fontsize=8)
    _save(fig, out_dir, "checkpoint", written)


def plot_serve(rows, out_dir, written):
    series = collections.defaultdict(list)
    for r in rows:
        if "tokens_per_s" in r:
            series[(r["model"], r["ranks"])].append((r["concurrency"], r["tokens_per_s"]))
    if not series:
        return
    fig, ax = _figure("serving: tokens/s vs concurrency", "concurrent requests", "tokens/s", True)
    for (model, ranks), pts in sorted(series.items()):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                label=f"{model}, {ranks} rank(s)")
    ax.legend(fontsize=8)
    _save(fig, out_dir, "serve", written)


def plot_fsdp(rows, out_dir, written):
    """Training state per rank and time per step, per side (FSDP, replicated, PyTorch's FSDP2,
    one process), one group of bars per rank count."""
    import matplotlib.pyplot as plt

    rows = [r for r in rows if "state_bytes" in r]
    if not rows:
        return
    worlds = sorted({r["ranks"] for r in rows})
    sides = [s for s in ("fsdp", "replicated", "pytorch", "one_process")
             if any(r["side"] == s for r in rows)]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    width = 0.8 / len(sides)
    for k, side in enumerate(sides):
        for ax, key, scale in ((axes[0], "state_bytes", 2**20), (axes[1], "ms_per_step", 1)):
            xs, ys = [], []
            for i, w in enumerate(worlds):
                got = [r[key] for r in rows if r["side"] == side and r["ranks"] == w]
                if got:
                    xs.append(i + k * width)
                    ys.append(got[0] / scale)
            ax.bar(xs, ys, width, label=side.replace("_", " "))
    for ax, title, ylabel in ((axes[0], "training state per rank", "MiB (params, grads, AdamW)"),
                              (axes[1], "time per training step", "ms")):
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        ax.set_xticks([i + width * (len(sides) - 1) / 2 for i in range(len(worlds))])
        ax.set_xticklabels([f"{w} ranks" for w in worlds])
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    _save(fig, out_dir, "fsdp", written)


PLOTS = {"collectives": plot_collectives, "python": plot_python,
         "redistribute": plot_redistribute, "checkpoint": plot_checkpoint, "serve": plot_serve,
         "fsdp": plot_fsdp}


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    name, path, out_dir = argv
    if name not in PLOTS:
        print(f"plot_bench: no figure for '{name}' (figures: {', '.join(sorted(PLOTS))})",
              file=sys.stderr)
        return 0
    import matplotlib

    matplotlib.use("Agg")
    os.makedirs(out_dir, exist_ok=True)
    written = []
    PLOTS[name](rows_of(path, name), out_dir, written)
    for p in written:
        print(f"plot: {p}")
    if not written:
        print(f"plot_bench: {path} has no rows to plot for '{name}'", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
