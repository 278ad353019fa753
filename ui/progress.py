"""Job progress from the workers' event files, read incrementally (no Gradio here).

A worker appends JSON lines to ``events.jsonl``; the UI polls every two seconds. Re-reading
whole files on every poll grows with the job's length, so :class:`EventCache` keeps, per file,
the byte offset already read and the events so far, and each poll reads only what was appended.
:func:`progress` says what the job does now: its latest count with an ETA, or, from the worker's
first second until the first count, the stage it announced and how long it has been at it.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from lab.calibration.metrics import finite_or_none
from lab.core.events import STAGE, START, read_events
from lab.core.layout import EVENTS_FILE

PROGRESS_KEYS = ("step", "total")
# Fields the pages do arithmetic on or draw (counts, the ETA, the training curves): an event holding one
# that is no finite number (``"step": "x"``, ``"loss": [1]``; lab.core.events checks ``time`` and ``stage``)
# is left out of every page rather than stop the poll that reads it.
NUMBER_KEYS = ("step", "total", "tokens", "tokens_total", "tokens_settled", "loss", "lr", "epoch")
MARKERS = (START, STAGE)  # events that say a stage (with no count yet) began
STARTING = "starting"  # what a worker does between its start event and its first stage
ESTIMATE = "estimate at its pace of the last minute"  # what the ETA is: no promise, the load may change
RECENT_S = 60.0  # the ETA's pace: the stage's work over about its last minute (eta_seconds says why)


@dataclass
class _Entry:
    offset: int = 0
    events: list[dict[str, Any]] = field(default_factory=list)


class EventCache:
    """Events of many run directories, each file read from where the last poll stopped."""

    def __init__(self) -> None:
        self._entries: dict[Path, _Entry] = {}
        self._lock = threading.Lock()

    def events(self, run_dir: Optional[str | Path]) -> list[dict[str, Any]]:
        if not run_dir:
            return []
        path = Path(run_dir) / EVENTS_FILE
        with self._lock:
            entry = self._entries.setdefault(path, _Entry())
            new, entry.offset = read_events(path, entry.offset)
            entry.events.extend(event for event in new if usable(event))
            return entry.events


def usable(event: dict[str, Any]) -> bool:
    """Whether every :data:`NUMBER_KEYS` field ``event`` has is a finite number, and its ``name`` text."""
    numbers = all(finite_or_none(event[key]) is not None for key in NUMBER_KEYS if key in event)
    return numbers and isinstance(event.get("name", ""), str)


@dataclass(frozen=True)
class Progress:
    """A stage's count and ETA, or (``step`` None) a stage with no count and its time so far."""

    stage: str
    step: Optional[int]
    total: Optional[int]
    eta_s: Optional[float]
    elapsed_s: Optional[float] = None  # seconds since an uncounted stage began
    fraction: Optional[float] = None  # of the stage's work done where events weigh it (tokens); else step/total

    @property
    def text(self) -> str:
        """One measure of how far the stage is: the share of its tokens where the events weigh
        them (``scoring 40% (by tokens, of 100)``), else the count (``scoring 16/100 (16%)``).
        The ETA says it is an estimate (:func:`eta_seconds`). Never the count beside the tokens'
        share: the longest questions come first, so a count of 0/100 at 40 % of the tokens reads as
        a contradiction."""
        if self.step is None or self.total is None:
            return f"{self.stage}… {format_seconds(self.elapsed_s)}"
        eta = f", ETA {format_seconds(self.eta_s)} ({ESTIMATE})" if self.eta_s is not None else ""
        if self.fraction is not None:
            return f"{self.stage} {100 * self.fraction:.0f}% (by tokens, of {self.total}){eta}"
        pct = 100 * self.step / self.total if self.total else 0
        return f"{self.stage} {self.step}/{self.total} ({pct:.0f}%){eta}"


def format_seconds(seconds: Optional[float]) -> str:
    if seconds is None:
        return ""
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def _counted(event: dict[str, Any]) -> bool:
    return all(k in event for k in PROGRESS_KEYS) and bool(event.get("total"))


def progress(events: list[dict[str, Any]], now: Optional[float] = None) -> Optional[Progress]:
    """What the job does now: the latest counted step with its ETA, or the stage announced after it.

    The share done is of the work where the events weigh it (``tokens``: it moves inside a long
    batch while the count of questions waits for the batch's end), else of the count. A stage
    announced (``loading model bundled``) or the worker's start, with no count since, is shown with
    the seconds since it began (``now``: the current Unix time), so a job says what it does from
    its first second rather than nothing until its first count.
    """
    at = next((i for i in range(len(events) - 1, -1, -1)
               if _counted(events[i]) or events[i].get("stage") in MARKERS), None)
    if at is None:
        return None
    last = events[at]
    if not _counted(last):
        name = last.get("name") or (STARTING if last["stage"] == START else last["stage"])
        elapsed = max(0.0, (time.time() if now is None else now) - last["time"])
        return Progress(str(name), None, None, None, elapsed)
    fraction = last["tokens"] / last["tokens_total"] if last.get("tokens_total") and "tokens" in last else None
    return Progress(last["stage"], int(last["step"]), int(last["total"]), eta_seconds(events[: at + 1]),
                    fraction=fraction)


def eta_seconds(events: list[dict[str, Any]]) -> Optional[float]:
    """Seconds left in the stage of the last event (a counted one), estimated from the job's own
    recent pace: the wall time per unit of work over its last :data:`RECENT_S` of work, times the
    work left, plus the pauses still to come at their measured length.

    Its own pace, recent, because the machine's load moves: on a CPU shared with other jobs a
    stage's pace halves when they start, and a rate averaged from the stage's start (what this was
    before) kept the pace of its quieter minutes; a fixed idle-machine speed would be further off.

    The stage's run is its counted events back to the latest stage announcement (or an earlier
    run of the same stage). The work is in the tokens of the finished batches (``tokens_settled``)
    where the events carry them: scoring takes the longest questions first, so questions per second
    rise as it goes and a rate in questions would over-estimate what is left two- to four-fold
    (BoolQ); and ``tokens``, which moves inside a batch by a pass's share, reached a cloze batch's
    end after its first pass although its options' passes take as long again, so an ETA timed on it
    read half the time left. Else in ``tokens``, else in steps. Measured from the run's first event,
    a ``step`` 0 where the stage says one, so the first batch's time counts too; the time already
    spent on the batch in flight is taken off.

    A stage that stops for side work between two counts (``<stage>_eval``, the validation after
    each epoch; ``<stage>_estep``, RCFT's E-step) would swing an ETA taken over its whole run:
    low before each pause, high after it (a fine-tune read 11m02s, 1m38s, 5m25s, 6m58s). So the
    work is timed between counts with no pause inside, and each kind of pause is added at its
    mean length beyond that rate, as many times as it still comes at the period (in steps) it came
    at so far. Before the first pause nothing of it is known, and the ETA counts the work alone.
    """
    last = events[-1]
    run = [len(events) - 1]  # indices of the run's counted events, newest first
    for i in range(len(events) - 2, -1, -1):
        event = events[i]
        if event.get("stage") in MARKERS:
            break
        if event.get("stage") == last["stage"] and _counted(event):
            if event["step"] > events[run[-1]]["step"] or event["total"] != last["total"]:
                break  # an earlier run of the same stage
            run.append(i)
    done_key, total_key = _work_keys(last)
    points = _reached(events, [i for i in reversed(run) if done_key in events[i]], done_key)
    done, left = events[points[-1]][done_key] - events[points[0]][done_key], last[total_key] - events[points[-1]][done_key]
    if done <= 0 or left <= 0:
        return None
    clean, pauses = [], []  # clean: (seconds, work) between counts; pauses: (kind, its step, seconds, work)
    for a, b in zip(points, points[1:]):
        seconds, units = events[b]["time"] - events[a]["time"], events[b][done_key] - events[a][done_key]
        side = [e for e in events[a + 1:b] if str(e.get("stage", "")).startswith(f"{last['stage']}_")]
        if side:
            pauses.append((side[0]["stage"], side[0].get("step", events[a]["step"]), seconds, units))
        else:
            clean.append((seconds, units))
    # Time already spent on the batch in flight, which tokens_settled does not count yet (the
    # other measures move with the work, so nothing of it is left out)
    in_flight = last["time"] - events[points[-1]]["time"] if done_key == "tokens_settled" else 0.0
    if not clean:  # every interval held a pause: no clean rate, so the whole run's
        return max(0.0, (events[points[-1]]["time"] - events[points[0]]["time"]) / done * left - in_flight)
    rate = _recent_rate(clean)
    pending = sum(_pauses_left(pauses, kind, rate, last) for kind in {p[0] for p in pauses})
    return max(0.0, rate * left - in_flight) + pending


def _work_keys(last: dict[str, Any]) -> tuple[str, str]:
    """The fields that count a stage's work done and in all: the finished batches' tokens, else
    the tokens with the batch in flight's share (events of before ``tokens_settled``), else steps."""
    if "tokens_total" in last:
        for key in ("tokens_settled", "tokens"):
            if key in last:
                return key, "tokens_total"
    return PROGRESS_KEYS


def _reached(events: list[dict[str, Any]], counted: list[int], key: str) -> list[int]:
    """Of ``counted`` (indices, oldest first), the first event to say each new ``key`` value: when
    the work reached it (the events after it, until the next value, are time spent on the next)."""
    points = counted[:1]
    for i in counted[1:]:
        if events[i][key] != events[points[-1]][key]:
            points.append(i)
    return points


def _recent_rate(clean: list[tuple[float, int]]) -> float:
    """Seconds per unit of work over the newest intervals that together last :data:`RECENT_S`
    (all of them where the stage is younger): the pace the machine gives the job now."""
    seconds, units = 0.0, 0
    for interval_s, interval_units in reversed(clean):
        seconds, units = seconds + interval_s, units + interval_units
        if seconds >= RECENT_S and units > 0:
            break
    if units <= 0:  # no work in the newest intervals: the whole run's
        seconds, units = sum(s for s, _ in clean), sum(u for _, u in clean)
    return seconds / units if units > 0 else 0.0


def _pauses_left(pauses: list[tuple[str, int, float, int]], kind: str, rate: float, last: dict[str, Any]) -> float:
    """Seconds of the pauses of ``kind`` still to come: their mean length beyond the work done
    during them (at ``rate``), times how many more come, at the period in steps they came at
    (from step 0 when one has come)."""
    seen = [(step, seconds - rate * units) for name, step, seconds, units in pauses if name == kind]
    steps = [step for step, _ in seen]
    period = (steps[-1] - steps[0]) / (len(steps) - 1) if len(steps) > 1 else steps[0]
    if period <= 0:
        return 0.0
    coming = int((last["total"] - steps[-1]) // period)
    return max(0.0, sum(extra for _, extra in seen) / len(seen)) * coming
