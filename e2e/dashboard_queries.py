#!/usr/bin/env python3
"""Checks every query of the Grafana dashboard against a real Prometheus.

Reads each panel's targets from the dashboard JSON (deploy/grafana/wasmless.json), replaces
the Grafana variables as Grafana would ($function with every value of the variable's own
query, all selected; $__rate_interval, $__interval, $__range), and asks Prometheus's HTTP
API for it: a query that does not parse is answered 400 bad_data, one with nothing to show
returns no series or only NaN. Either fails the check, naming the panel.

    e2e/dashboard_queries.py --prometheus http://127.0.0.1:19090 [--range 10m]

Standard library only. e2e/dashboard_picture.py draws the same queries over time.
"""

import argparse
import json
import math
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

DASHBOARD = Path(__file__).resolve().parent.parent / "deploy" / "grafana" / "wasmless.json"


class QueryError(Exception):
    pass


def api(prometheus, path, params):
    """GET one Prometheus API path; the `data` of its answer, or QueryError with its error."""
    url = f"{prometheus}/api/v1/{path}?{urllib.parse.urlencode(params, doseq=True)}"
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            body = json.load(response)
    except urllib.error.HTTPError as error:
        try:
            body = json.load(error)
        except ValueError:
            raise QueryError(f"HTTP {error.code} from {url}") from None
        raise QueryError(f"{body.get('errorType')}: {body.get('error')}") from None
    except urllib.error.URLError as error:
        raise QueryError(f"cannot reach Prometheus at {prometheus} ({error.reason}): is it running?") from None
    if body.get("status") != "success":
        raise QueryError(f"{body.get('errorType')}: {body.get('error')}")
    return body["data"]


def load(path=DASHBOARD):
    return json.loads(Path(path).read_text())


def variable_query(dashboard, name):
    """The `label_values(metric, label)` query of a template variable: (metric, label)."""
    for variable in dashboard["templating"]["list"]:
        if variable["name"] == name:
            definition = variable.get("definition") or variable["query"]["query"]
            match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", definition.strip())
            if not match:
                raise QueryError(f"variable ${name}: not a label_values query: {definition}")
            return match.group(1).strip(), match.group(2)
    raise QueryError(f"the dashboard has no variable ${name}")


def variable_values(prometheus, dashboard, name):
    metric, label = variable_query(dashboard, name)
    return api(prometheus, f"label/{label}/values", {"match[]": metric})


def targets(dashboard):
    """(panel title, refId, expr) of every target of every panel, rows included."""
    def walk(panels):
        for panel in panels:
            yield from walk(panel.get("panels", []))
            for target in panel.get("targets", []):
                yield panel["title"], target.get("refId", "?"), target["expr"]
    return list(walk(dashboard["panels"]))


def regex_literal(value):
    """`value` matched literally by a regex inside a PromQL string: a metacharacter gets a
    backslash, itself escaped for the string (Python's re.escape would also escape `-`,
    an escape PromQL strings refuse)."""
    return "".join("\\\\" + c if c in r"\.+*?()|[]{}^$" else c for c in value)


def substitute(expr, values, rate_interval="1m", interval="15s", range_="10m"):
    """The query Grafana sends: a multi-value variable is the regex `(a|b)`, like Grafana's."""
    functions = "(" + "|".join(regex_literal(v) for v in values) + ")" if values else ".*"
    replaced = (expr.replace("$__rate_interval", rate_interval).replace("$__interval", interval)
                .replace("$__range", range_).replace("${function}", functions).replace("$function", functions))
    left = re.findall(r"\$\{?\w+", replaced)
    if left:
        raise QueryError(f"variables this check does not know: {', '.join(sorted(set(left)))}")
    return replaced


def finite(series):
    """The series with at least one number that is not NaN or infinite."""
    def has_number(s):
        values = s.get("values") or [s["value"]]
        return any(math.isfinite(float(v)) for _, v in values)
    return [s for s in series if has_number(s)]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prometheus", default="http://127.0.0.1:19090")
    parser.add_argument("--dashboard", default=str(DASHBOARD))
    parser.add_argument("--range", default="10m", help="what $__range stands for: the time the run sent requests over")
    parser.add_argument("--rate-interval", default="1m", help="what $__rate_interval stands for")
    parser.add_argument("--function", action="append", default=[],
                        help="what $function stands for (repeatable); default: every value of its own query")
    args = parser.parse_args()
    dashboard = load(args.dashboard)
    try:
        functions = args.function or variable_values(args.prometheus, dashboard, "function")
    except QueryError as error:
        print(f"FAILED: the $function variable's query: {error}", file=sys.stderr)
        return 1
    if not functions:
        print(f"FAILED: the $function variable's query {variable_query(dashboard, 'function')} found no function: "
              "is Prometheus scraping the operator?", file=sys.stderr)
        return 1
    print(f"$function: {', '.join(functions)}")
    failures = []
    checked = 0
    for title, ref, expr in targets(dashboard):
        checked += 1
        try:
            query = substitute(expr, functions, rate_interval=args.rate_interval, range_=args.range)
            result = api(args.prometheus, "query", {"query": query})["result"]
        except QueryError as error:
            failures.append(f"panel '{title}' query {ref}: {error}\n    {expr}")
            continue
        numbers = finite(result)
        if not numbers:
            what = "only NaN" if result else "no series"
            failures.append(f"panel '{title}' query {ref}: {what}\n    {query}")
            continue
        sample = ", ".join(
            f"{','.join(f'{k}={v}' for k, v in sorted(s['metric'].items()))}={float(s['value'][1]):.4g}"
            for s in numbers[:3])
        print(f"ok   {title} [{ref}]: {len(numbers)} series ({sample}{', …' if len(numbers) > 3 else ''})")
    for failure in failures:
        print(f"FAILED: {failure}", file=sys.stderr)
    print(f"{checked - len(failures)} of {checked} panel queries returned data")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
