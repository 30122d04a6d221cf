"""Metric names in PromQL expressions and in Prometheus exposition text.

``referenced(expr)`` lists the metric names a PromQL expression selects (functions,
aggregations, keywords, label names, strings, durations and Grafana variables are
not metric names). ``exported(text)`` lists every series name that a ``/metrics``
page can produce, from its ``# TYPE`` lines as well as its samples, so a labelled
metric that has not been observed yet still counts: a counter ``x_total`` yields
``x_total`` and ``x_created``, a histogram ``x`` yields ``x_bucket``, ``x_sum``,
``x_count`` and ``x_created``.
"""

from __future__ import annotations

import re

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", re.IGNORECASE)
_GRAFANA_VAR = re.compile(r"\$(?:\{[^}]*\}|\w+)")
_OFFSET = re.compile(r"\boffset\s+-?\w+", re.IGNORECASE)
_AT = re.compile(r"@\s*(?:start\(\)|end\(\)|[\d.]+)")
_NUMBER = re.compile(
    r"(?<![\w:])(?:0x[0-9a-f]+|\d+(?:\.\d*)?(?:e[+-]?\d+)?|\.\d+(?:e[+-]?\d+)?)", re.IGNORECASE
)
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_KEYWORDS = frozenset(
    {"and", "or", "unless", "bool", "by", "without", "on", "ignoring", "group_left", "group_right",
     "offset", "atan2", "inf", "nan"}
)  # fmt: skip


def referenced(expr: str) -> set[str]:
    """Metric names selected by the PromQL expression ``expr``."""
    text = _STRING.sub(" ", expr)
    text = _GRAFANA_VAR.sub("1", text)
    # Label matchers and ranges first (they may hold anything), then grouping clauses.
    text = _MATCHERS.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    text = _OFFSET.sub(" ", text)
    text = _AT.sub(" ", text)
    text = _NUMBER.sub(" ", text)
    names: set[str] = set()
    for match in _IDENT.finditer(text):
        name = match.group(0)
        rest = text[match.end() :].lstrip()
        if rest.startswith("("):
            continue  # a function or an aggregation
        if name.lower() in _KEYWORDS:
            continue
        names.add(name)
    return names


def grafana_query_names(query: str) -> set[str]:
    """Metric names of a Grafana template query (``label_values(metric, label)``, ``query_result(...)``)."""
    label_values = re.fullmatch(r"\s*label_values\((.*),\s*\w+\s*\)\s*", query)
    if label_values:
        return referenced(label_values.group(1))
    query_result = re.fullmatch(r"\s*query_result\((.*)\)\s*", query)
    if query_result:
        return referenced(query_result.group(1))
    if re.fullmatch(r"\s*(label_names\(.*\)|metrics\(.*\)|label_values\(\s*\w+\s*\))\s*", query):
        return set()
    return referenced(query)


_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
    "summary": ("", "_sum", "_count", "_created"),
}


def exported(text: str) -> set[str]:
    """Every series name that the exposition ``text`` declares or contains."""
    names: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            parts = line.split()
            if len(parts) < 4:
                continue
            name, kind = parts[2], parts[3]
            if kind == "counter":
                base = name.removesuffix("_total")
                names.update(base + suffix for suffix in _SUFFIXES["counter"])
            elif kind in _SUFFIXES:
                names.update(name + suffix for suffix in _SUFFIXES[kind])
            else:
                names.add(name)
        elif line and not line.startswith("#"):
            match = _IDENT.match(line)
            if match:
                names.add(match.group(0))
    return names


def dashboard_queries(dashboard: dict[str, object]) -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and template query of a Grafana dashboard."""
    out: list[tuple[str, str]] = []

    def walk_panels(panels: object) -> None:
        if not isinstance(panels, list):
            return
        for panel in panels:
            if not isinstance(panel, dict):
                continue
            for target in panel.get("targets") or []:
                expr = target.get("expr") if isinstance(target, dict) else None
                if isinstance(expr, str) and expr.strip():
                    out.append((f"panel {panel.get('title')!r} {target.get('refId')}", expr))
            walk_panels(panel.get("panels"))

    walk_panels(dashboard.get("panels"))
    templating = dashboard.get("templating")
    variables = templating.get("list", []) if isinstance(templating, dict) else []
    for variable in variables:
        if not isinstance(variable, dict) or variable.get("type") != "query":
            continue
        query = variable.get("query")
        if isinstance(query, dict):
            query = query.get("query")
        if isinstance(query, str) and query.strip():
            out.append((f"variable ${variable.get('name')}", f"__grafana__:{query}"))
    return out


def names_in(query: str) -> set[str]:
    """Metric names of one entry of :func:`dashboard_queries` (PromQL or a Grafana template query)."""
    if query.startswith("__grafana__:"):
        return grafana_query_names(query.removeprefix("__grafana__:"))
    return referenced(query)
