#!/usr/bin/env python3
"""Draws one trace, as an OpenTelemetry Collector's file exporter wrote it (OTLP JSON, a line
per export), as an SVG waterfall: a row per span, indented under its parent, its bar where it
started and ended, its service's colour, errors in red. docs/trace.svg is drawn by this from
the trace the runtime's trace test checks (Function `a` calling `b`, which calls itself):

    WASMLESS_TRACE_SPANS=/tmp/spans.jsonl cargo test --release -p wasmless-runtime --test runtime \
        traces::one_trace_across_functions
    python3 e2e/trace_picture.py /tmp/spans.jsonl --out docs/trace.svg

Without --trace, the trace with the most spans in the file; --fold NAME draws spans named
NAME without their children (docs/apply-trace.svg, an apply's trace, folds its reconciles).
No dependencies but Python's own.
"""

import argparse
import json
import sys
from html import escape

ROW = 22
LABEL = 330
BAR = 560
PAD = 10
TOP = 46
# One colour per service, in the order services first appear.
COLOURS = ["#3b7dd8", "#2e9e6a", "#9b59b6", "#d4892a"]
ERROR = "#d9443c"
KINDS = {1: "", 2: "server", 3: "client", 4: "producer", 5: "consumer"}


def attributes(items):
    out = {}
    for item in items or []:
        value = item.get("value", {})
        for key in ("stringValue", "intValue", "boolValue", "doubleValue"):
            if key in value:
                out[item["key"]] = str(value[key])
    return out


def read(path):
    spans = []
    with open(path) as file:
        for line in file:
            try:
                batch = json.loads(line)
            except ValueError:
                continue
            for resource_spans in batch.get("resourceSpans", []):
                resource = attributes(resource_spans.get("resource", {}).get("attributes"))
                for scope in resource_spans.get("scopeSpans", []):
                    for span in scope.get("spans", []):
                        spans.append({
                            "service": resource.get("service.name", "?"),
                            "trace": span.get("traceId", ""),
                            "id": span.get("spanId", ""),
                            "parent": span.get("parentSpanId", ""),
                            "name": span.get("name", ""),
                            "kind": span.get("kind", 0),
                            "start": int(span.get("startTimeUnixNano", 0)),
                            "end": int(span.get("endTimeUnixNano", 0)),
                            "error": span.get("status", {}).get("code") == 2,
                            "attributes": attributes(span.get("attributes")),
                        })
    return spans


def label(span):
    """What a person reads first: the request's path for a server span, the URL called for a
    client span, else the span's name."""
    attrs = span["attributes"]
    if span["kind"] == 2 and "url.path" in attrs:
        return f"{span['name']} {attrs['url.path']}"
    if span["kind"] == 3 and "url.full" in attrs:
        url = attrs["url.full"]
        path = url.split("://", 1)[-1].split("/", 1)[-1].split("?", 1)[0]
        return f"{span['name']} → /{path}"
    return span["name"]


def ordered(spans):
    """Depth first from the roots (spans whose parent is not in the trace), children by start."""
    ids = {span["id"] for span in spans}
    children = {}
    for span in spans:
        children.setdefault(span["parent"] if span["parent"] in ids else None, []).append(span)
    out = []

    def walk(parent, depth):
        for span in sorted(children.get(parent, []), key=lambda s: s["start"]):
            out.append((depth, span))
            walk(span["id"], depth + 1)

    walk(None, 0)
    return out


def folded(spans, names):
    """The spans but the descendants of those named one of `names`."""
    by_id = {span["id"]: span for span in spans}

    def hidden(span):
        parent = by_id.get(span["parent"])
        while parent is not None:
            if parent["name"] in names:
                return True
            parent = by_id.get(parent["parent"])
        return False

    return [span for span in spans if not hidden(span)]


def duration(nanos, total):
    """Milliseconds for a trace of a request, seconds for one of seconds (an apply)."""
    if total >= 2e9:
        return f"{nanos / 1e9:.2f} s"
    return f"{nanos / 1e6:.2f} ms"


def svg(spans, title):
    rows = ordered(spans)
    start = min(span["start"] for span in spans)
    end = max(span["end"] for span in spans)
    total = max(end - start, 1)
    services = []
    for _, span in rows:
        if span["service"] not in services:
            services.append(span["service"])
    colour = {service: COLOURS[i % len(COLOURS)] for i, service in enumerate(services)}
    width = PAD + LABEL + BAR + 90
    height = TOP + ROW * len(rows) + 40
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="DejaVu Sans, Arial, sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
        f'<text x="{PAD}" y="18" font-size="14" font-weight="bold">{escape(title)}</text>',
    ]
    # Time axis: five ticks over the trace's span.
    for i in range(6):
        x = PAD + LABEL + BAR * i / 5
        out.append(f'<line x1="{x:.1f}" y1="{TOP - 6}" x2="{x:.1f}" y2="{TOP + ROW * len(rows)}" stroke="#e4e4e4"/>')
        out.append(f'<text x="{x:.1f}" y="{TOP - 10}" text-anchor="middle" fill="#666">{duration(total * i / 5, total)}</text>')
    for row, (depth, span) in enumerate(rows):
        y = TOP + ROW * row
        kind = KINDS.get(span["kind"], "")
        text = f"{span['service']} · {label(span)}" + (f"  ({kind})" if kind else "")
        out.append(f'<text x="{PAD + 14 * depth}" y="{y + 15}">{escape(text)}</text>')
        x = PAD + LABEL + BAR * (span["start"] - start) / total
        w = max(BAR * (span["end"] - span["start"]) / total, 1.5)
        fill = ERROR if span["error"] else colour[span["service"]]
        out.append(f'<rect x="{x:.1f}" y="{y + 4}" width="{w:.1f}" height="{ROW - 8}" rx="2" fill="{fill}"/>')
        out.append(f'<text x="{x + w + 4:.1f}" y="{y + 15}" fill="#444">{duration(span["end"] - span["start"], total)}</text>')
    y = TOP + ROW * len(rows) + 22
    x = PAD
    for service in services:
        out.append(f'<rect x="{x}" y="{y - 10}" width="12" height="12" fill="{colour[service]}"/>')
        name = service if service.startswith("wasmless-") else f"Function {service}"
        out.append(f'<text x="{x + 16}" y="{y}">{escape(name)}</text>')
        x += 40 + 7 * len(name)
    out.append(f'<rect x="{x}" y="{y - 10}" width="12" height="12" fill="{ERROR}"/>')
    out.append(f'<text x="{x + 16}" y="{y}">error</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("spans", help="the collector's file exporter output (OTLP JSON lines)")
    parser.add_argument("--trace", help="the trace id (default: the trace with the most spans)")
    parser.add_argument("--out", default="-", help="where to write the SVG (default: stdout)")
    parser.add_argument(
        "--fold",
        action="append",
        default=[],
        metavar="NAME",
        help="draw spans named NAME without their children (an apply's many reconciles: --fold reconcile)",
    )
    args = parser.parse_args()
    spans = read(args.spans)
    if not spans:
        sys.exit(f"{args.spans}: no spans (is it the collector's file exporter output?)")
    if args.trace:
        trace = args.trace
    else:
        counts = {}
        for span in spans:
            counts[span["trace"]] = counts.get(span["trace"], 0) + 1
        trace = max(counts, key=counts.get)
    spans = [span for span in spans if span["trace"] == trace]
    if not spans:
        sys.exit(f"{args.spans}: no span of trace {trace}")
    title = f"trace {trace}: {len(spans)} spans"
    if args.fold:
        spans = folded(spans, set(args.fold))
        title += f" ({' and '.join(args.fold)} spans without their children)"
    picture = svg(spans, title)
    if args.out == "-":
        sys.stdout.write(picture)
    else:
        with open(args.out, "w") as file:
            file.write(picture)
        print(f"wrote {args.out} ({len(spans)} spans of trace {trace})", file=sys.stderr)


if __name__ == "__main__":
    main()
