#!/usr/bin/env python3
"""Plots `kvtier_gpu_bench` decode results (its OUT.json) as one standalone SVG: three panels
that show issue 15's targets at a glance, one colour a format, one line style a bench file.

  1. batch x 32K, one call: % of the read roof against the batch (1, 8, 64, 256); the NVFP4
     target (70% at batch >= 8) dashed;
  2. batch 1, 32 calls back to back: % of the read roof against the context (1K to 128K);
  3. batch 1 x 8K, a step replayed from a CUDA graph: microseconds a step, a bar a format and
     file; the 12 us target dashed.

Usage: plot_decode_bench.py OUT.svg BENCH.json [BENCH2.json ...]
  Each file is labelled with its GPU and date; compare files from different GPUs by % of the
  roof (each against its own read roof), not by time.
Exit status: 0 when written; 2 on a file that cannot be read or holds no decode rows (nothing
written). Shapes a file lacks are left out of its lines and listed on stderr.
"""
import json
import re
import sys
from xml.sax.saxutils import escape

# (the bench's case name, label, colour)
FORMATS = [
    ("fp16", "FP16", "#1f77b4"),
    ("fp8_e4m3_block_head", "FP8", "#ff7f0e"),
    ("nvfp4_block_head", "NVFP4", "#2ca02c"),
    ("balanced_mix", "mix", "#d62728"),
    ("fp16_tail_nvfp4", "FP16 tail + NVFP4", "#9467bd"),
    ("fp16_tail_fp8", "FP16 tail + FP8", "#8c564b"),
]
DASHES = ["", "6,4", "2,3", "10,3,2,3"]
BATCHES = [1, 8, 64, 256]
CONTEXTS_K = [1, 8, 32, 128]
ROW = re.compile(r"decode_(?P<case>.+)_b(?P<batch>\d+)_ctx(?P<ctx>\d+)k_splits\d+(?P<variant>.*)")

PANEL_W, PANEL_H, LEFT, TOP, GAP = 300, 250, 55, 60, 45
LEGEND_H = 22


def load(path):
    """{(case, batch, context_k, variant): row} and the file's label, or raises ValueError."""
    try:
        with open(path) as f:
            bench = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: cannot read a bench JSON ({e})") from e
    if not isinstance(bench, dict) or not isinstance(bench.get("decode"), list):
        raise ValueError(f"{path}: not a kvtier_gpu_bench JSON (no list 'decode')")
    rows = {}
    for row in bench["decode"]:
        if not isinstance(row, dict) or not {"pct_of_read_roof", "median_ms"} <= row.keys():
            continue
        m = ROW.fullmatch(str(row.get("name", "")))
        if m:
            key = (m["case"], int(m["batch"]), int(m["ctx"]), m["variant"])
            rows[key] = row
    if not rows:
        raise ValueError(f"{path}: no decode rows (a bench run with --data-plane-only?)")
    label = f"{bench.get('gpu', 'unknown GPU')}, {bench.get('date', 'no date')[:10]}"
    return rows, label


class Svg:
    def __init__(self, width, height):
        self.width, self.height, self.parts = width, height, []

    def add(self, element):
        self.parts.append(element)

    def text(self, x, y, s, size=11, anchor="start", fill="#222"):
        self.add(f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" '
                 f'fill="{fill}">{escape(s)}</text>')

    def line(self, x1, y1, x2, y2, stroke="#999", dash="", width=1):
        d = f' stroke-dasharray="{dash}"' if dash else ""
        self.add(f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" '
                 f'stroke="{stroke}" stroke-width="{width}"{d}/>')

    def polyline(self, points, stroke, dash):
        d = f' stroke-dasharray="{dash}"' if dash else ""
        pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
        self.add(f'<polyline points="{pts}" fill="none" stroke="{stroke}" stroke-width="2"{d}/>')
        for x, y in points:
            self.add(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{stroke}"/>')

    def rect(self, x, y, w, h, fill, stroke="none", dash=""):
        d = f' stroke-dasharray="{dash}"' if dash else ""
        self.add(f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" '
                 f'fill="{fill}" stroke="{stroke}"{d}/>')

    def __str__(self):
        return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width}" '
                f'height="{self.height}" font-family="sans-serif">\n'
                f'<rect width="100%" height="100%" fill="white"/>\n' +
                "\n".join(self.parts) + "\n</svg>\n")


def dash(f):
    """The line style of the f-th file."""
    return DASHES[f % len(DASHES)]


def lookup(rows, label, key, missing):
    """rows[key], or None with the shape added to `missing`."""
    row = rows.get(key)
    if row is None:
        missing.append(f"{label}: {key[0]} {key[1:]}")
    return row


def axes(svg, x0, title, y_max, y_step, y_unit, x_labels):
    """Draws a panel's frame, grid and labels (a palette's "A + B" on two lines); returns (x of
    tick i, y of a value)."""
    svg.text(x0, TOP - 25, title, 13)
    svg.rect(x0, TOP, PANEL_W, PANEL_H, "none", "#999")
    for v in range(0, int(y_max) + 1, y_step):
        y = TOP + PANEL_H * (1 - v / y_max)
        svg.line(x0, y, x0 + PANEL_W, y, "#eee")
        svg.text(x0 - 6, y + 4, f"{v}{y_unit}", 10, "end")
    n = len(x_labels)
    x_of = lambda i: x0 + PANEL_W * (i + 0.5) / n
    for i, label in enumerate(x_labels):
        for line, text in enumerate(label.replace(" + ", "\n+ ").split("\n")):
            svg.text(x_of(i), TOP + PANEL_H + 16 + 11 * line, text, 10, "middle")
    return x_of, lambda v: TOP + PANEL_H * (1 - min(v, y_max) / y_max)


def line_panel(svg, x0, title, files, keys, x_labels, missing):
    """A % of read roof panel: a line a (format, file) over keys(case) -> [key per x]."""
    x_of, y_of = axes(svg, x0, title, 100, 20, "%", x_labels)
    for f, (rows, label) in enumerate(files):
        for case, _, colour in FORMATS:
            points = []
            for i, key in enumerate(keys(case)):
                row = lookup(rows, label, key, missing)
                if row is not None:
                    points.append((x_of(i), y_of(row["pct_of_read_roof"])))
            if points:
                svg.polyline(points, colour, dash(f))
    return y_of


def bar_panel(svg, x0, files, missing):
    """The batch-1 x 8K step from a graph: a bar a (format, file), in us."""
    steps = [[lookup(rows, label, (case, 1, 8, "_graph"), missing) for case, _, _ in FORMATS]
             for rows, label in files]
    longest = max([r["median_ms"] * 1e3 for s in steps for r in s if r] + [12.0])
    y_max = 5 * (int(longest / 5) + 1)
    _, y_of = axes(svg, x0, "Batch 1 x 8K, a step from a graph: us", y_max, 5, "",
                   [label for _, label, _ in FORMATS])
    slot = PANEL_W / len(FORMATS)
    bar = 0.8 * slot / len(files)
    for i, (_, _, colour) in enumerate(FORMATS):
        for f in range(len(files)):
            row = steps[f][i]
            if row is None:
                continue
            us = row["median_ms"] * 1e3
            x = x0 + slot * i + 0.1 * slot + bar * f
            svg.rect(x, y_of(us), bar, TOP + PANEL_H - y_of(us), colour if f == 0 else "white",
                     colour, dash(f))
            svg.text(x + bar / 2, y_of(us) - 3, f"{us:.1f}", 8, "middle")
    svg.line(x0, y_of(12), x0 + PANEL_W, y_of(12), "#444", "3,3")
    svg.text(x0 + PANEL_W, TOP - 8, "dashed: the 12 us target", 9, "end", "#444")


def plot(files):
    """The SVG document of `files` ([(rows, label)] from load) and the shapes they lack."""
    missing = []
    width = LEFT + 3 * PANEL_W + 2 * GAP + 20
    legend_rows = 1 + len(files)
    svg = Svg(width, TOP + PANEL_H + 40 + LEGEND_H * legend_rows)
    y_of = line_panel(svg, LEFT, "Batch x 32K, one call: % of read roof", files,
                      lambda c: [(c, b, 32, "") for b in BATCHES], [f"b{b}" for b in BATCHES],
                      missing)
    svg.line(LEFT + PANEL_W / 4, y_of(70), LEFT + PANEL_W, y_of(70), "#2ca02c", "3,3")
    svg.text(LEFT + PANEL_W - 4, y_of(70) - 4, "NVFP4 target", 9, "end", "#2ca02c")
    x1 = LEFT + PANEL_W + GAP
    line_panel(svg, x1, "Batch 1, back to back: % of read roof", files,
               lambda c: [(c, 1, k, "_back_to_back") for k in CONTEXTS_K],
               [f"{k}K" for k in CONTEXTS_K], missing)

    bar_panel(svg, x1 + PANEL_W + GAP, files, missing)

    # Legend: the formats' colours, then each file's line style.
    y = TOP + PANEL_H + 50
    x = LEFT
    for _, label, colour in FORMATS:
        svg.rect(x, y - 9, 12, 10, colour)
        svg.text(x + 16, y, label)
        x += 30 + 7 * len(label)
    for f, (_, label) in enumerate(files):
        y += LEGEND_H
        svg.line(LEFT, y - 4, LEFT + 40, y - 4, "#222", dash(f), 2)
        svg.text(LEFT + 48, y, label + (" (bars filled)" if f == 0 else " (bars open)"))
    return str(svg), missing


def main(argv):
    if len(argv) < 3:
        print("usage: plot_decode_bench.py OUT.svg BENCH.json [BENCH2.json ...]", file=sys.stderr)
        return 2
    try:
        files = [load(path) for path in argv[2:]]
    except ValueError as e:
        print(f"plot_decode_bench: {e}", file=sys.stderr)
        return 2
    svg, missing = plot(files)
    for m in missing:
        print(f"plot_decode_bench: no row for {m}", file=sys.stderr)
    try:
        with open(argv[1], "w") as f:
            f.write(svg)
    except OSError as e:
        print(f"plot_decode_bench: cannot write {argv[1]}: {e}", file=sys.stderr)
        return 2
    print(f"wrote {argv[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
