"""The Compare page and its inference lane, with a stand-in lane: the pre-load as the page opens,
the lane's line (warming up, ready, not running), and that none of it starts a lane unless asked."""
import time
from typing import Any, Optional

import pytest

from jobs.lane import LaneError, Warmup
from ui import compare_page
from ui.context import LabContext, LaneOptions

pytestmark = pytest.mark.unit


class FakeLane:
    """What the page asks of :class:`jobs.lane.Lane`, without a worker: it records the pre-loads asked."""

    def __init__(self) -> None:
        self.preloads: list[list[dict[str, Any]]] = []
        self.warmup: Optional[Warmup] = None
        self.running: dict[str, Any] = {"running": False}

    def preload(self, models: list[dict[str, Any]]) -> Optional[Warmup]:
        self.preloads.append(models)
        self.warmup = Warmup(tuple(m["model"] for m in models), time.time() - 3, expected_s=9.4)
        return self.warmup

    def last_status(self) -> dict[str, Any]:
        return self.running

    def status(self) -> dict[str, Any]:
        return self.running

    @property
    def pid(self) -> Optional[int]:
        return self.running.get("pid")

    def call(self, op: str, args: dict[str, Any], progress=None) -> Any:
        raise LaneError("the stand-in lane answers nothing", "internal")


def _ctx(tmp_path, monkeypatch, preload: str = "open") -> tuple[LabContext, FakeLane]:
    lane = FakeLane()
    monkeypatch.setattr(LabContext, "lane", property(lambda self: lane))
    return LabContext(tmp_path / "runs", lane_options=LaneOptions(device="cpu", preload=preload)), lane


def test_opening_the_page_preloads_the_models_its_form_shows(tmp_path, monkeypatch):
    ctx, lane = _ctx(tmp_path, monkeypatch)
    line = compare_page.opened(ctx, *compare_page.FORM_MODELS)
    assert lane.preloads == [[{"model": "bundled"}]]
    assert line.startswith("Inference lane: warming up, starting the lane… (about 9 s; 3 s so far).")
    # the form's models each once, temperatures aside; a model the compare would refuse is not loaded
    compare_page.opened(ctx, "bundled|", "scratch|", "bundled|", None)
    compare_page.opened(ctx, "/etc|", None, None, None)
    assert lane.preloads[1:] == [[{"model": "bundled"}, {"model": "scratch"}], []]


def test_no_preload_unless_asked(tmp_path, monkeypatch):
    """A context built without app.py's --lane-preload (a test's, a script's) starts no lane; the
    server pre-loads as the page opens unless told otherwise."""
    from app import parse_args

    assert LaneOptions().preload == "off" and parse_args([]).lane_preload == "open"
    ctx, lane = _ctx(tmp_path, monkeypatch, preload="off")
    assert compare_page.opened(ctx, *compare_page.FORM_MODELS) == compare_page.NOT_RUNNING
    assert lane.preloads == []


def test_the_lane_s_line_says_warming_ready_or_not_running():
    warmup = Warmup(("bundled", "bundled + lora"), started=100.0, expected_s=None, stage="loading bundled")
    line = compare_page.warming_line(warmup, now=104.2)
    assert line.startswith("Inference lane: warming up, loading bundled… (the first time here takes seconds to a "
                           "minute; 4 s so far). A compare asked now starts")
    held = {"running": True, "device": "cpu", "pid": 7, "budget": 2**30, "used": 2**20,
            "held": [{"model": "bundled", "adapter": None, "bytes": 2**20, "last_used": 0.0}]}
    warmup.seconds, warmup.pid = 8.24, 7
    assert compare_page.describe_lane(held, warmup) == ("Inference lane: ready on cpu (pid 7), warmed up in 8.2 s; "
                                                        "holds bundled (1.0 MiB); 1.0 MiB of 1.00 GiB used.")
    warmup.pid = 6  # another worker did the warm-up (this one was started by a compare)
    assert compare_page.describe_lane(held, warmup).startswith("Inference lane: running on cpu (pid 7); holds")
    assert compare_page.describe_lane({"running": False}, warmup) == compare_page.NOT_RUNNING
    warmup.error = "bundled needs about 1 GiB; the inference lane may hold 0.5 GiB"
    assert compare_page.describe_lane({"running": False}, warmup).endswith(
        "failed: bundled needs about 1 GiB; the inference lane may hold 0.5 GiB")


def test_a_compare_asked_while_the_lane_warms_says_it_waits_for_it(tmp_path, monkeypatch):
    ctx, lane = _ctx(tmp_path, monkeypatch)
    lane.preload([{"model": "bundled"}]).stage = "loading bundled"
    said = [s[0] for s in compare_page.run_compare(ctx, "Q?\nA\nB", "bundled|", None, None, None, "", "", "", "")]
    assert "still warming up (loading bundled): the compare starts as soon as it is ready" in said[0]
    assert "answers nothing" in said[-1]


@pytest.mark.slow
def test_the_app_preloads_as_the_compare_tab_opens_and_at_start_when_asked(tmp_path, monkeypatch):
    import gradio as gr

    from ui.app import build

    ctx, lane = _ctx(tmp_path, monkeypatch)
    demo = build(ctx)
    assert lane.preloads == []  # building the app (the server's start) loads nothing by default
    tab, = [b for b in demo.blocks.values() if isinstance(b, gr.Tab) and b.label == "Compare models"]
    on_select = [fn.fn for fn in demo.fns.values() if (tab._id, "select") in fn.targets]
    assert any(getattr(fn, "func", None) is compare_page.opened for fn in on_select)
    ctx, lane = _ctx(tmp_path, monkeypatch, preload="start")
    build(ctx)
    assert lane.preloads == [[{"model": "bundled"}]]


@pytest.mark.parametrize("stage", ["starting the lane", "loading bundled"])
def test_the_lane_s_poll_never_asks_the_worker(tmp_path, monkeypatch, stage):
    """Asking the worker counts as a request and would keep an idle lane alive: the page's poll reads
    only what the server knows."""
    ctx, lane = _ctx(tmp_path, monkeypatch)
    lane.preload([{"model": "bundled"}]).stage = stage
    assert stage in compare_page.lane_line(ctx)
    lane.warmup.seconds, lane.warmup.pid = 5.0, 9
    lane.running = {"running": True, "device": "cpu", "pid": 9, "budget": 2**30}
    assert compare_page.lane_line(ctx) == "Inference lane: ready on cpu (pid 9), warmed up in 5.0 s."
