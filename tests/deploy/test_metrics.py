"""deploy/grafana: the dashboard asks only for metrics listed in metrics.txt, and
those names follow Prometheus conventions (stalwart_ namespace, base units as
suffixes, counters ending in _total)."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from tests.deploy.project import DEPLOY

GRAFANA = DEPLOY / "grafana"
TYPES = {"counter", "gauge", "histogram"}
#: Units a name may end in (Prometheus base units; "versions" counts versions).
UNITS = ("_seconds", "_bytes", "_ratio", "_celsius", "_versions")
#: Gauges whose value has no unit: scores, identities (a version, a step), flags, counts of
#: things, and a user metric's own value (its unit is the metric's).
UNITLESS_GAUGE = re.compile(r"_(score|version|step|epoch|loss|value|nodes)$|_is_\w+$|^up$")
NOT_BASE_UNITS = re.compile(
    r"_(milliseconds|ms|us|minutes|hours|kb|mb|gb|kib|mib|gib|percent)(_|$)"
)
PROMQL_WORDS = {
    "sum", "rate", "increase", "histogram_quantile", "max", "min", "avg", "by", "without",
    "count", "irate", "le", "on", "ignoring", "and", "or", "unless", "offset", "bool",
}  # fmt: skip


def _metrics() -> dict[str, str]:
    out = {}
    for line in (GRAFANA / "metrics.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, kind, *_ = line.split()
            assert name not in out, f"{name} listed twice"
            out[name] = kind
    return out


def _exprs() -> list[str]:
    dash = json.loads((GRAFANA / "dashboards" / "stalwart.json").read_text())
    panels = [p for p in dash["panels"] if p["type"] != "row"]
    assert panels
    return [t["expr"] for p in panels for t in p["targets"]]


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression (label matchers, ranges, label lists,
    strings and function names removed)."""
    expr = re.sub(r'"[^"]*"', "", expr)
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]", "", expr)
    expr = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", expr)
    names = set()
    for m in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr):
        word, after = m.group(), expr[m.end() :].lstrip()[:1]
        if word not in PROMQL_WORDS and after != "(" and not word.startswith("__"):
            names.add(word)
    return names


def test_the_name_extraction() -> None:
    expr = 'histogram_quantile(0.95, sum by (instance, le) (rate(x_seconds_bucket{job="a"}[5m])))'
    assert metric_names(expr) == {"x_seconds_bucket"}
    assert metric_names("max by (role, state) (stalwart_coordinator_nodes)") == {
        "stalwart_coordinator_nodes"
    }


def test_dashboard_uses_only_listed_metrics() -> None:
    listed = _metrics()
    allowed = set(listed)
    allowed |= {
        f"{n}{s}"
        for n, k in listed.items()
        if k == "histogram"
        for s in ("_bucket", "_sum", "_count")
    }
    used = set().union(*(metric_names(e) for e in _exprs()))
    assert used, "no metric found in the dashboard"
    assert not used - allowed, f"not in metrics.txt: {sorted(used - allowed)}"
    bases = {re.sub(r"_(bucket|sum|count)$", "", n) if n not in listed else n for n in used}
    unused = set(listed) - bases
    assert not unused, f"listed but unused by the dashboard: {sorted(unused)}"


@pytest.mark.parametrize("name,kind", sorted(_metrics().items()))
def test_names_follow_prometheus_conventions(name: str, kind: str) -> None:
    assert kind in TYPES
    assert re.fullmatch(r"[a-z_][a-z0-9_]*", name)
    assert name.startswith(("stalwart_", "grpc_server_")) or name == "up"
    assert not NOT_BASE_UNITS.search(name), "use base units (seconds, bytes)"
    assert not re.search(r"_(bucket|sum|count)$", name), "reserved suffix"
    if kind == "counter":
        assert name.endswith("_total")
    else:
        assert not name.endswith("_total")
    if kind == "histogram":
        assert name.endswith(UNITS)
    if kind == "gauge":
        assert name.endswith(UNITS) or UNITLESS_GAUGE.search(name), "gauge needs a unit suffix"


def test_provisioning_points_at_the_dashboard() -> None:
    ds = yaml.safe_load((GRAFANA / "provisioning/datasources/prometheus.yml").read_text())
    uid = ds["datasources"][0]["uid"]
    dash = json.loads((GRAFANA / "dashboards" / "stalwart.json").read_text())
    for panel in dash["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == uid
    provider = yaml.safe_load((GRAFANA / "provisioning/dashboards/stalwart.yml").read_text())
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"


def test_services_export_listed_names_only() -> None:
    """Metrics the library already registers must be in the list under the same type."""
    from prometheus_client import REGISTRY

    import stalwart.metrics  # noqa: F401 - registers the shared series

    listed = _metrics()
    for family in REGISTRY.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        if name.endswith("_phase_seconds"):
            continue  # the step timeline's series, read by `stalwart bench` (docs/performance.md)
        if name.startswith("stalwart_") or name.startswith("grpc_server_handl"):
            assert listed.get(name) == family.type, f"{name} ({family.type}) not in metrics.txt"
