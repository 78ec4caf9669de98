#!/usr/bin/env python3
"""Draws the Grafana dashboard (deploy/grafana/wasmless.json) from a real Prometheus, as a PNG.

Grafana does not run here, so this lays the panels out on the dashboard's own grid, with
their titles, units and legends, and fills them with what the dashboard's queries return
over a time range (query_range; the bar gauge's instant query at its end). docs/dashboard.png
is drawn by this from the end-to-end test's cluster:

    WASMLESS_DASHBOARD_PICTURE=docs/dashboard.png e2e/run.sh ... prometheus_scrapes dashboard_queries

or by hand against any Prometheus that scrapes Wasmless:

    python e2e/dashboard_picture.py --prometheus http://127.0.0.1:19090 --start UNIX --end UNIX --out dashboard.png

Needs matplotlib (pip install matplotlib).
"""

import argparse
import math
import re
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.dont_write_bytecode = True  # no __pycache__ in the checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))
import dashboard_queries as dq  # noqa: E402

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.dates as mdates  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

# Grafana's dark theme, so the picture reads as the dashboard people will see.
BACKGROUND = "#111217"
PANEL = "#181b1f"
BORDER = "#2c3235"
TEXT = "#ccccdc"
MUTED = "#8e8e8e"
PALETTE = ["#73bf69", "#f2cc0c", "#5794f2", "#ff780a", "#f2495c", "#b877d9", "#8ab8ff", "#ff9830", "#37872d", "#fade2a"]


def legend(fmt, metric):
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: metric.get(m.group(1), ""), fmt).strip() or "value"


def duration(value):
    if value == 0:
        return "0"
    if value < 1e-3:
        return f"{value * 1e6:.0f} µs"
    if value < 1:
        return f"{value * 1e3:.3g} ms"
    return f"{value:.3g} s"


FORMATS = {
    "s": duration,
    "percentunit": lambda v: f"{v * 100:.3g}%",
    "reqps": lambda v: f"{v:.3g} req/s",
    "short": lambda v: f"{v:.3g}",
}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prometheus", default="http://127.0.0.1:19090")
    parser.add_argument("--dashboard", default=str(dq.DASHBOARD))
    parser.add_argument("--start", type=float, required=True, help="unix time the range starts")
    parser.add_argument("--end", type=float, default=None, help="unix time it ends (default now)")
    parser.add_argument("--rate-interval", default="30s")
    parser.add_argument("--function", action="append", default=[],
                        help="what $function stands for (repeatable); default: every value of its own query")
    parser.add_argument("--source", default="the e2e test cluster", help="where the data came from, for the header")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    end = args.end or time.time()
    start = args.start
    step = max(1.0, (end - start) / 240)
    dashboard = dq.load(args.dashboard)
    functions = args.function or dq.variable_values(args.prometheus, dashboard, "function")
    range_ = f"{int(math.ceil(end - start))}s"

    panels = dashboard["panels"]
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    unit_w, unit_h = 0.8, 0.42  # inches per grid column and grid row
    header = 0.9
    fig = plt.figure(figsize=(24 * unit_w, rows * unit_h + header), facecolor=BACKGROUND)
    height = rows * unit_h + header
    fig.text(0.008, 1 - 0.28 / height, dashboard["title"], color=TEXT, fontsize=16, weight="bold", va="center")
    span = (f"{datetime.fromtimestamp(start, timezone.utc):%Y-%m-%d %H:%M:%S} to "
            f"{datetime.fromtimestamp(end, timezone.utc):%H:%M:%S} UTC")
    fig.text(0.008, 1 - 0.65 / height,
             f"Prometheus: {args.source}     Function: All ({', '.join(functions)})     {span}",
             color=MUTED, fontsize=10, va="center")

    for panel in panels:
        g = panel["gridPos"]
        pad_x, pad_y = 0.12, 0.12
        left = (g["x"] * unit_w + pad_x) / (24 * unit_w)
        width = (g["w"] * unit_w - 2 * pad_x) / (24 * unit_w)
        bottom = 1 - (header + (g["y"] + g["h"]) * unit_h - pad_y) / height
        box_h = (g["h"] * unit_h - 2 * pad_y) / height
        frame = fig.add_axes([left, bottom, width, box_h], facecolor=PANEL)
        frame.set_xticks([])
        frame.set_yticks([])
        for spine in frame.spines.values():
            spine.set_color(BORDER)
        frame.text(0.015, 0.965, panel["title"], transform=frame.transAxes, color=TEXT, fontsize=11,
                   weight="bold", va="top")
        # The plot inside the panel, clear of its title and with room for axis labels and legend.
        inner = fig.add_axes([left + width * 0.1, bottom + box_h * 0.27, width * 0.86, box_h * 0.6], facecolor=PANEL)
        for spine in inner.spines.values():
            spine.set_visible(False)
        inner.tick_params(colors=MUTED, labelsize=8)
        inner.grid(color=BORDER, linewidth=0.6)
        fmt = FORMATS.get(panel["fieldConfig"]["defaults"].get("unit", "short"), FORMATS["short"])
        inner.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos, fmt=fmt: fmt(v)))
        lines = []
        for target in panel["targets"]:
            query = dq.substitute(target["expr"], functions, rate_interval=args.rate_interval, range_=range_)
            if panel["type"] == "bargauge":
                for series in dq.api(args.prometheus, "query", {"query": query, "time": end})["result"]:
                    lines.append((legend(target.get("legendFormat", ""), series["metric"]), float(series["value"][1])))
                continue
            result = dq.api(args.prometheus, "query_range",
                            {"query": query, "start": start, "end": end, "step": step})["result"]
            for series in result:
                points = [(datetime.fromtimestamp(float(t), timezone.utc), float(v)) for t, v in series["values"]]
                points = [(t, v) for t, v in points if math.isfinite(v)]
                if points:
                    lines.append((legend(target.get("legendFormat", ""), series["metric"]), points))
        if panel["type"] == "bargauge" and not lines:
            inner.grid(False)
            inner.set_xticks([])
            inner.set_yticks([])
            inner.text(0.5, 0.5, "No data", transform=inner.transAxes, color=MUTED, ha="center", va="center")
            continue
        if panel["type"] == "bargauge":
            lines.sort()
            inner.grid(False)
            color = panel["fieldConfig"]["defaults"].get("color", {}).get("fixedColor", PALETTE[4])
            names = [name for name, _ in lines]
            values = [value for _, value in lines]
            inner.barh(range(len(values)), values, color=color, height=0.6)
            inner.set_yticks(range(len(values)), names)
            inner.invert_yaxis()
            inner.set_xlim(0, max(values + [1]) * 1.25)
            inner.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:.0f}"))
            for i, value in enumerate(values):
                inner.text(value, i, f"  {value:.0f}", color=TEXT, va="center", fontsize=10, weight="bold")
            inner.tick_params(axis="y", labelsize=9, labelcolor=TEXT)
            continue
        for i, (name, points) in enumerate(sorted(lines)):
            times, values = zip(*points)
            inner.plot(times, values, color=PALETTE[i % len(PALETTE)], linewidth=1.3, label=name)
        inner.set_xlim(datetime.fromtimestamp(start, timezone.utc), datetime.fromtimestamp(end, timezone.utc))
        inner.xaxis.set_major_formatter(
            mdates.DateFormatter("%H:%M" if end - start > 1200 else "%H:%M:%S", tz=timezone.utc))
        inner.xaxis.set_major_locator(mdates.AutoDateLocator(maxticks=6))
        # As Grafana does for counts and rates: from 0, and a gauge that stayed at 0 on a 0-1 axis.
        highest = max((v for _, points in lines for _, v in points), default=0)
        inner.set_ylim(0, highest * 1.1 if highest > 0 else 1)
        if not lines:
            inner.text(0.5, 0.5, "No data", transform=inner.transAxes, color=MUTED, ha="center", va="center")
        else:
            columns = 2 if len(lines) > 3 else 1
            inner.legend(loc="upper left", bbox_to_anchor=(-0.1, -0.12), ncol=max(columns, min(len(lines), 3)),
                         frameon=False, fontsize=7.5, labelcolor=TEXT, handlelength=1.2, columnspacing=1.0)
    fig.savefig(args.out, dpi=80, facecolor=BACKGROUND)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
