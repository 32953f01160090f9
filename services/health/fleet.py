"""The health service's decisions: per-node windows in, risks and alert drafts out (pure).

``observe`` takes one validated sample and returns the node's new assessment and
the alerts it warrants. The gRPC layer (servicer.py) only validates, stamps
time and publishes; the clock is always passed in.

A node's risk is the largest of: the hardware rules, the thermal rule, the
straggler rule against its live peers (services/health/rules.py), the fleet
Isolation Forest's anomaly times ``anomaly_weight`` (below the drain threshold on
its own by default: an unlabelled detector ranks nodes for placement but does not
drain them alone), and a sticky 1.0 once corruption was reported about it.

The anomaly detector sees each gauge as a departure from the live fleet's median of
it, not as its level. Peers run the same work on the same kind of machine, so what
they do together (an idle cluster's memory and cpu drifting, a job starting) is not a
node's fault; watched live, absolute levels drifted past every reference the detector
was refitted on within seconds, and every node alerted every 30 s. A lone node has no
peers: its departures are all zero, and the detector stays unfitted until a peer
reports.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from services.health import rules
from services.health.online import DEFAULT_DETECTOR, FleetForest
from services.health.window import NodeWindow, Sample
from stalwart.errors import ErrorKind, StalwartError

ANOMALY = "anomaly"
PREDICTED_FAILURE = "predicted_failure"
STRAGGLER = "straggler"
DATA_CORRUPTION = "data_corruption"


@dataclass(frozen=True)
class HealthConfig:
    window_samples: int = 120
    fit_samples: int = 200
    drain_threshold: float = 0.8
    anomaly_alert: float = 0.995
    anomaly_alert_scorings: int = 3
    """An anomaly alert needs this many consecutive scorings at ``anomaly_alert`` or
    above (one every ``anomaly_every_seconds``), as an alerting rule's ``for:`` does:
    watched live, an idle node's spiky gauges (cpu of a sleeping process, a heartbeat's
    allocation) crossed it for one scoring now and then, and every node alerted about
    every 30 s. The risk itself is not held back."""
    anomaly_weight: float = 0.6
    anomaly_every_seconds: float = 2.0
    """A node's anomaly score is recomputed at most this often (the rules run on every
    sample): one Isolation Forest score takes 5-150 ms by the machine's load, and five
    samples a second per node would outrun the service on a loaded machine."""
    refit_min_seconds: float = 60.0
    """The detector refits on the fleet's latest samples when most live nodes look
    anomalous at once (the fleet moved, not a node: see ``Fleet.fit_samples``), at
    most this often."""
    alert_repeat_seconds: float = 30.0
    peer_stale_seconds: float = 30.0
    peer_centre_seconds: float = 1.0
    """How often the fleet's per-gauge median (what the detector's inputs are measured
    from) is recomputed from the live nodes' latest samples: once per interval, not per
    sample, so a sample costs the same in a fleet of thousands."""
    detector: str = DEFAULT_DETECTOR
    rules: rules.RuleConfig = field(default_factory=rules.RuleConfig)
    max_nodes: int = 10_000
    """Nodes tracked at once. Every node id costs a window and a metrics series, so a
    sender inventing ids could otherwise grow the service without end; when a new id
    finds the fleet full, nodes silent for ``forget_after_seconds`` are forgotten, and
    if none are, the sample is refused (``FleetFull``)."""
    forget_after_seconds: float = 600.0


@dataclass(frozen=True)
class Assessment:
    node_id: str
    risk: float
    anomaly: float
    top_signals: tuple[str, ...]
    time: float
    reasons: tuple[str, ...] = ()
    lead_s: float | None = None
    """Predicted seconds to failure (the soonest a finding expects); None: none predicted."""


@dataclass(frozen=True)
class AlertDraft:
    kind: str
    node_id: str
    risk: float
    message: str
    drain: bool


class FleetFull(StalwartError):
    """A sample (or a corruption report) about a new node past ``max_nodes``: refused as
    RESOURCE_EXHAUSTED [LIMIT_EXCEEDED]."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorKind.LIMIT_EXCEEDED, message)


class Fleet:
    def __init__(self, config: HealthConfig = HealthConfig()):
        self.config = config
        self.windows: dict[str, NodeWindow] = {}
        self.forest = FleetForest(config.fit_samples, detector=config.detector)
        self.assessments: dict[str, Assessment] = {}
        self.corrupt: dict[str, str] = {}  # node id -> why (sticky risk 1)
        self._last_alert: dict[tuple[str, str], float] = {}  # (node, kind) -> time
        self._scored: dict[str, tuple[float, float, list[str]]] = {}  # node -> (t, score, top)
        self._strange_streak: dict[str, int] = {}  # node -> scorings in a row >= alert
        self._fit_at: float | None = None  # when the last fit's samples were handed out
        self._centre: dict[str, float] = {}  # gauge -> the live fleet's median
        self._centre_at = 0.0  # when _centre was taken (meaningless while it is empty)
        self._relative: dict[str, dict[str, float]] = {}  # node -> its latest departures
        self.forgotten: list[str] = []  # ids forget_quiet dropped, for the adapter to clear

    # --- input ----------------------------------------------------------------------

    def observe(
        self, node_id: str, now: float, step: int, metrics: Mapping[str, float]
    ) -> tuple[Assessment, list[AlertDraft]]:
        window = self.windows.get(node_id)
        if window is None:
            if len(self.windows) >= self.config.max_nodes and not self.forget_quiet(now):
                raise FleetFull(
                    f"{len(self.windows)} nodes tracked, each heard from in the last "
                    f"{self.config.forget_after_seconds:g} s; a new node is refused until "
                    "one goes quiet (--max-nodes)"
                )
            window = self.windows[node_id] = NodeWindow(node_id, self.config.window_samples)
        window.add(Sample(now, step, dict(metrics)))
        relative = self._relative[node_id] = self._relative_to_peers(now, metrics)
        self.forest.collect(relative)
        assessment = self._assess(window, now)
        self.assessments[node_id] = assessment
        return assessment, self._alerts(assessment, now)

    def forget_quiet(self, now: float) -> list[str]:
        """Drop every node not heard from within ``forget_after_seconds``: its window,
        assessment and per-node state. A corruption report stays (its risk is sticky
        for a node that comes back). Returns the ids forgotten."""
        quiet = [
            n for n, w in self.windows.items()
            if now - w.last_time > self.config.forget_after_seconds
        ]  # fmt: skip
        for n in quiet:
            for per_node in (self.windows, self.assessments, self._scored,
                             self._strange_streak, self._relative):  # fmt: skip
                per_node.pop(n, None)
        self._last_alert = {k: v for k, v in self._last_alert.items() if k[0] not in quiet}
        self.forgotten.extend(quiet)
        return quiet

    def _relative_to_peers(self, now: float, metrics: Mapping[str, float]) -> dict[str, float]:
        """Each gauge minus the live fleet's median of it; a gauge the median does not
        cover yet (new since it was taken) is left out until it does."""
        # Taken again at once while it is empty (fewer than two live nodes), so the
        # second node to report has a median to depart from from its first sample.
        if not self._centre or not 0 <= now - self._centre_at < self.config.peer_centre_seconds:
            self._centre, self._centre_at = self._fleet_centre(now), now
        return {k: v - self._centre[k] for k, v in metrics.items() if k in self._centre}

    def _live(self, now: float) -> dict[str, NodeWindow]:
        """The windows of the nodes heard from within ``peer_stale_seconds``."""
        stale = self.config.peer_stale_seconds
        return {n: w for n, w in self.windows.items() if now - w.last_time <= stale}

    def _fleet_centre(self, now: float) -> dict[str, float]:
        latest = [w.samples[-1].metrics for w in self._live(now).values()]
        if len(latest) < 2:
            return {}  # no peers: no departures, and nothing for the detector to learn
        values: dict[str, list[float]] = {}
        for metrics in latest:
            for name, v in metrics.items():
                if not name.endswith("_total"):  # counters never reach the detector
                    values.setdefault(name, []).append(v)
        return {name: float(np.median(vs)) for name, vs in values.items()}

    @property
    def ready_to_fit(self) -> bool:
        return not self.forest.fitted and len(self.forest.pending) >= self.forest.fit_samples

    def fit_samples(self, now: float) -> list[Mapping[str, float]] | None:
        """The samples to fit the detector on now, or None when no fit is due.

        First fit: the fleet's first ``fit_samples`` samples. Refit: the latest ones,
        when more than half of the nodes heard from lately score as anomalous at once
        and the last fit is ``refit_min_seconds`` old. Nodes of one fleet run the same
        work, so when most of them depart together from what the detector learned, the
        reference is stale (an idle cluster's cpu and memory gauges drift off the
        seconds it was fitted on), not the nodes sick; one node departing from its
        peers leaves the reference alone and stays anomalous."""
        forest = self.forest
        if self.ready_to_fit:
            self._fit_at = now
            return list(forest.pending)
        if not forest.fitted or len(forest.recent) < forest.fit_samples:
            return None
        if self._fit_at is not None and now - self._fit_at < self.config.refit_min_seconds:
            return None
        if not self._reference_is_stale(now):
            return None
        self._fit_at = now
        return list(forest.recent)

    def _reference_is_stale(self, now: float) -> bool:
        cfg = self.config
        live = [self.assessments[n] for n in self._live(now) if n in self.assessments]
        flagged = sum(a.anomaly >= cfg.anomaly_alert for a in live)
        return 2 * flagged > len(live)

    def report_corruption(self, node_id: str, message: str, now: float) -> AlertDraft:
        """Corruption caught elsewhere: risk 1 from now on, and an alert. Reports are
        sticky, so they are never forgotten to make room: past ``max_nodes`` nodes
        reported, a report about yet another node is refused (FleetFull)."""
        if node_id not in self.corrupt and len(self.corrupt) >= self.config.max_nodes:
            raise FleetFull(
                f"corruption reported about {len(self.corrupt)} nodes, each kept for good; "
                "a report about another node is refused (--max-nodes)"
            )
        self.corrupt[node_id] = message
        old = self.assessments.get(node_id)
        self.assessments[node_id] = Assessment(
            node_id, 1.0, old.anomaly if old else 0.0, ("data_corruption",), now, (message,)
        )
        self._last_alert[(node_id, DATA_CORRUPTION)] = now
        return AlertDraft(DATA_CORRUPTION, node_id, 1.0, message, drain=False)

    # --- decisions ------------------------------------------------------------------

    def _assess(self, window: NodeWindow, now: float) -> Assessment:
        cfg = self.config
        peers = [w for w in self._live(now).values() if w is not window]
        findings = (
            rules.hardware(window)
            + rules.thermal(window, cfg.rules)
            + rules.straggler(window, peers, cfg.rules)
        )
        anomaly, top = self._anomaly(window, now)
        risk = max([f.risk for f in findings] + [cfg.anomaly_weight * anomaly])
        reasons = [f.message for f in sorted(findings, key=lambda f: -f.risk)]
        signals = [f.signal for f in sorted(findings, key=lambda f: -f.risk)]
        if window.node_id in self.corrupt:
            risk = 1.0
            reasons.insert(0, self.corrupt[window.node_id])
            signals.insert(0, "data_corruption")
        signals += [s for s in top if s not in signals]
        leads = [f.lead_s for f in findings if f.lead_s is not None]
        return Assessment(window.node_id, min(1.0, risk), anomaly, tuple(signals[:5]), now,
                          tuple(reasons), min(leads) if leads else None)  # fmt: skip

    def _anomaly(self, window: NodeWindow, now: float) -> tuple[float, list[str]]:
        last = self._scored.get(window.node_id)
        if last is not None and 0 <= now - last[0] < self.config.anomaly_every_seconds:
            return last[1], last[2]
        anomaly, top = self.forest.score(self._relative.get(window.node_id, {}))
        if self.forest.fitted:  # before the fit every score is 0: score again once fitted
            self._scored[window.node_id] = (now, anomaly, top)
            strange = anomaly >= self.config.anomaly_alert
            streak = self._strange_streak.get(window.node_id, 0)
            self._strange_streak[window.node_id] = streak + 1 if strange else 0
        return anomaly, top

    def _alerts(self, a: Assessment, now: float) -> list[AlertDraft]:
        cfg = self.config
        out = []
        if a.risk >= cfg.drain_threshold and a.node_id not in self.corrupt:
            kind = STRAGGLER if a.top_signals[:1] == (rules.STEP_TIME,) else PREDICTED_FAILURE
            why = "; ".join(a.reasons)
            if a.lead_s is not None:
                why += f"; failure expected in {a.lead_s:.0f} s" if a.lead_s else "; failing now"
            out.append(AlertDraft(kind, a.node_id, a.risk, why, drain=True))
        elif self._strange_streak.get(a.node_id, 0) >= cfg.anomaly_alert_scorings:
            why = ", ".join(a.top_signals) or "unusual combination of readings"
            out.append(AlertDraft(ANOMALY, a.node_id, a.risk,
                                  f"telemetry unlike the fleet's ({why})", drain=False))  # fmt: skip
        return [d for d in out if self._not_repeated(d, now)]

    def _not_repeated(self, draft: AlertDraft, now: float) -> bool:
        """One alert per (node, kind) per alert_repeat_seconds: watchers act once."""
        key = (draft.node_id, draft.kind)
        last = self._last_alert.get(key)
        if last is not None and now - last < self.config.alert_repeat_seconds:
            return False
        self._last_alert[key] = now
        return True
