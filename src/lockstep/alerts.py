"""Alert rules on per-step metrics: a threshold held for a duration, or a non-finite value.

The rules file: docs/gates.md#alert-rules. One `Evaluator` serves `lockstep gate alerts` and
`lockstep train`'s live alerts; design: docs/design/base.md.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

from lockstep.errors import UsageError
from lockstep.track import as_float

WHEN = ("above", "below", "nonfinite")
ACTIONS = ("warn", "stop")


@dataclass(frozen=True)
class Rule:
    name: str
    metric: str
    when: str
    threshold: float | None = None
    for_steps: int | None = None
    for_seconds: float | None = None
    action: str = "warn"

    def holds(self, value: float) -> bool:
        if self.when == "nonfinite":
            return not math.isfinite(value)
        if not math.isfinite(value):  # NaN is neither above nor below a threshold
            return False
        return value > self.threshold if self.when == "above" else value < self.threshold

    def describe(self) -> str:
        cond = "is NaN or Inf" if self.when == "nonfinite" else f"{self.when} {self.threshold:g}"
        if self.for_steps:
            span = f" for {self.for_steps} steps"
        elif self.for_seconds:
            span = f" for {self.for_seconds:g} s"
        else:
            span = ""
        return f"{self.metric} {cond}{span}"


@dataclass
class Alert:
    rule: str
    metric: str
    step: int
    value: float
    condition: str
    since_step: int
    action: str

    def message(self) -> str:
        return (
            f"alert {self.rule}: {self.condition} since step {self.since_step} "
            f"(value {self.value:g} at step {self.step}); action {self.action}"
        )

    def row(self) -> dict:
        """The metrics.jsonl line; `event` marks it for readers of step rows."""
        return {"event": "alert", **asdict(self), "value": _plain(self.value)}


def _plain(value: float):
    return value if math.isfinite(value) else repr(value)


def parse_rules(data: dict, source: str) -> list[Rule]:
    items = data.get("rule", [])
    if not isinstance(items, list):
        raise UsageError(f"{source}: 'rule' must be a list of tables ([[rule]])")
    rules = []
    for i, item in enumerate(items, 1):
        where = f"{source}: rule {i}"
        if not isinstance(item, dict):
            raise UsageError(f"{where} is not a table")
        unknown = set(item) - {
            "name",
            "metric",
            "when",
            "threshold",
            "for_steps",
            "for_seconds",
            "action",
        }
        if unknown:
            raise UsageError(f"{where}: unknown key {', '.join(sorted(unknown))}")
        metric, when = item.get("metric"), item.get("when")
        if not isinstance(metric, str) or not metric:
            raise UsageError(f"{where}: 'metric' (a metric name such as loss) is required")
        if when not in WHEN:
            raise UsageError(f"{where}: 'when' must be one of {', '.join(WHEN)}, got {when!r}")
        threshold = item.get("threshold")
        if when != "nonfinite" and not isinstance(threshold, int | float):
            raise UsageError(f"{where}: 'threshold' (a number) is required for when = '{when}'")
        if "for_steps" in item and "for_seconds" in item:
            raise UsageError(f"{where}: give for_steps or for_seconds, not both")
        for_steps, for_seconds = item.get("for_steps"), item.get("for_seconds")
        if for_steps is not None and (not isinstance(for_steps, int) or for_steps < 1):
            raise UsageError(f"{where}: for_steps must be a whole number of steps >= 1")
        if for_seconds is not None and (
            not isinstance(for_seconds, int | float) or for_seconds < 0
        ):
            raise UsageError(f"{where}: for_seconds must be a number of seconds >= 0")
        action = item.get("action", "warn")
        if action not in ACTIONS:
            raise UsageError(f"{where}: 'action' must be warn or stop, got {action!r}")
        name = str(item.get("name") or f"{metric}-{when}")
        if any(r.name == name for r in rules):
            if "name" in item:
                raise UsageError(f"{where}: another rule is already named '{name}'")
            name = f"{name}-{i}"
        rules.append(
            Rule(
                name=name,
                metric=metric,
                when=when,
                threshold=float(threshold) if threshold is not None else None,
                for_steps=for_steps,
                for_seconds=float(for_seconds) if for_seconds is not None else None,
                action=action,
            )
        )
    return rules


def default_rules() -> list[Rule]:
    text = resources.files("lockstep").joinpath("default-alerts.toml").read_text()
    return parse_rules(tomllib.loads(text), "lockstep's default alert rules")


def load_rules(spec: str | Path) -> list[Rule]:
    """`default` (the shipped rules) or a TOML rules file."""
    if str(spec) == "default":
        return default_rules()
    path = Path(spec)
    from lockstep.inputs import read_toml

    return parse_rules(read_toml(path, "alert rules"), str(path))


class _State:
    __slots__ = ("fired", "since_start", "since_step")

    def __init__(self) -> None:
        self.since_step: int | None = None
        self.since_start: float | None = None
        self.fired = False


class Evaluator:
    """Feed rows in step order; `feed` returns the alerts that fire at that row. A rule fires
    once its condition has held for its duration, and re-arms when it clears."""

    def __init__(self, rules: list[Rule]):
        self.rules = rules
        self._state = [_State() for _ in rules]
        self._clock = 0.0  # seconds of step_time_s summed so far
        self._last_time: float | None = None
        self._origin = 0.0
        self._start = 0.0  # seconds elapsed at the start of the current row
        self.seen: set[str] = set()  # metrics that appeared in some row

    def feed(self, row: dict) -> list[Alert]:
        end = self._end_time(row)
        start = self._start
        out = []
        for rule, st in zip(self.rules, self._state, strict=True):
            if rule.metric not in row:
                continue
            self.seen.add(rule.metric)
            value = as_float(row[rule.metric])
            if not rule.holds(value):
                st.since_step, st.since_start, st.fired = None, None, False
                continue
            if st.since_step is None:
                st.since_step, st.since_start = int(row["step"]), start
            if st.fired:
                continue
            if rule.for_steps:
                due = int(row["step"]) - st.since_step + 1 >= rule.for_steps
            elif rule.for_seconds:
                due = end - st.since_start >= rule.for_seconds
            else:
                due = True
            if due:
                st.fired = True
                out.append(
                    Alert(
                        rule.name,
                        rule.metric,
                        int(row["step"]),
                        value,
                        rule.describe(),
                        st.since_step,
                        rule.action,
                    )
                )
        self._start = end
        return out

    def _end_time(self, row: dict) -> float:
        """Seconds since the first row's start, from `time` where logged."""
        step_time = as_float(row.get("step_time_s"))
        if "time" in row and math.isfinite(as_float(row["time"])):
            now = as_float(row["time"])
            if self._last_time is None:  # the first row: its step began step_time_s earlier
                self._origin = now - (step_time if math.isfinite(step_time) else 0.0)
                self._start = 0.0
            self._last_time = now
            return now - self._origin
        self._clock += step_time if math.isfinite(step_time) else 0.0
        return self._clock

    def unevaluated(self) -> list[Rule]:
        """Rules whose metric never appeared: never passed silently."""
        return [r for r in self.rules if r.metric not in self.seen]


def evaluate(rules: list[Rule], rows: list[dict]) -> tuple[list[Alert], list[Rule]]:
    ev = Evaluator(rules)
    alerts = [a for row in rows for a in ev.feed(row)]
    return alerts, ev.unevaluated()
