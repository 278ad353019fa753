"""The inference lane: models kept within a budget, a worker that survives bad requests and is
replaced after a kill, callers that get their own answers, and a history that outlives the server."""
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch

from jobs.lane import WARMUPS_NAME, Lane, LaneError
from lab.models.cache import DoesNotFit, ModelCache, footprint
from lab.models.loading import LoadedModel
from lab.results.runs import comparison_choices

MIB = 1024**2


# ---------------------------------------------------------------- the cache, in process
def _fake_loader(calls: list[str], sizes: dict[str, int]):
    """A loader of plain modules of a known size (in float32 values), counting its calls."""
    def load(name, device="cpu", dtype="float32", announce=None):
        calls.append(name)
        return LoadedModel(torch.nn.Linear(sizes[name], 1, bias=False), None, name, name, None,
                           torch.device("cpu"), torch.float32)
    return load


@pytest.mark.unit
def test_the_least_recently_used_model_is_unloaded_first():
    calls: list[str] = []
    sizes = {"a": 1024 * 256, "b": 1024 * 256, "c": 1024 * 256}  # 1 MiB each
    cache = ModelCache("cpu", "float32", budget=int(2.5 * MIB), load=_fake_loader(calls, sizes))
    for name in ("a", "b", "a", "c", "a", "b"):
        with cache.use(name):
            pass
    # a b (a used again) c: b is the least recent and goes; then b comes back and c goes.
    assert calls == ["a", "b", "c", "b"]
    assert [e.base for e in cache.held()] == ["a", "b"] and cache.used == 2 * MIB
    with pytest.raises(DoesNotFit, match=r"^x needs 1.0 MiB; |^x needs about 1.0 MiB; the inference lane may hold 0.5 MiB on cpu"):
        ModelCache("cpu", "float32", budget=MIB // 2, load=_fake_loader([], {"x": 1024 * 256})).use("x").__enter__()


@pytest.mark.unit
def test_what_a_request_uses_is_never_evicted_under_it():
    calls: list[str] = []
    cache = ModelCache("cpu", "float32", budget=int(1.5 * MIB), load=_fake_loader(calls, {"a": 262144, "b": 262144}))
    with cache.use("a") as a:
        with cache.use("b"):  # does not fit beside a, but a is in use: over budget rather than pulled away
            assert [e.base for e in cache.held()] == ["a", "b"]
        assert a.model.weight.shape == (1, 262144)
    with cache.use("a"):
        pass
    assert calls == ["a", "b"]


@pytest.fixture(scope="module")
def adapters(tiny_model_dir, tmp_path_factory):
    """Two LoRA adapters on the tiny model, with weights far from zero so that each changes the logits."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    paths = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                               LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
        path = tmp_path_factory.mktemp(f"adapter{seed}")
        model.save_pretrained(path)
        paths.append(str(path))
    return paths


def _logits(loaded, ids):
    with torch.inference_mode():
        return loaded.model(ids).logits


@pytest.mark.model
def test_adapters_share_their_base_and_switch_without_a_reload(tiny_model_dir, adapters):
    from lab.models.loading import load_model

    calls: list[str] = []

    def counted(name, **kwargs):
        calls.append(name)
        return load_model(name, **kwargs)

    base, ids = str(tiny_model_dir), torch.tensor([[1, 5, 9, 14]])
    cache = ModelCache("cpu", "float32", budget=512 * MIB, load=counted)
    with cache.use(base) as plain:
        expected_base = _logits(plain, ids)
    expected = [_logits(load_model(base, adapter=a, device="cpu", dtype="float32"), ids) for a in adapters]
    for _ in range(2):
        for adapter, want in zip(adapters, expected):
            with cache.use(base, adapter) as loaded:
                torch.testing.assert_close(_logits(loaded, ids), want, atol=1e-4, rtol=1e-4)
        with cache.use(base) as loaded:  # every adapter off: the base model again
            torch.testing.assert_close(_logits(loaded, ids), expected_base)
    assert calls == [base] and len(cache.held()) == 3
    cache.evict(base, str(Path(adapters[0]).resolve()))
    cache.evict(base, str(Path(adapters[1]).resolve()))  # the last adapter: the LoRA layers go too
    with cache.use(base) as loaded:
        torch.testing.assert_close(_logits(loaded, ids), expected_base)
        assert footprint(loaded.model) == footprint(plain.model) and not hasattr(loaded.model, "peft_config")


# ---------------------------------------------------------------- the worker process
def _config(model: str, *questions: str, **extra):
    return {"questions": [{"question": q, "options": ["Oslo", "Helsinki", "Stockholm"]} for q in questions],
            "models": [{"model": model, **extra}], "max_new_tokens": 3}


@pytest.fixture
def lane(tmp_path):
    lane = Lane(tmp_path / ".lane", device="cpu", idle_s=120)
    yield lane
    lane.stop()


@pytest.mark.model
@pytest.mark.e2e
@pytest.mark.slow
def test_a_bad_model_is_refused_and_the_lane_keeps_serving(lane, tiny_model_dir, tmp_path):
    with pytest.raises(LaneError, match="does not exist") as refused:
        lane.call("compare", {"config": _config(str(tmp_path / "nope"), "Q?"), "out": str(tmp_path / "a")})
    assert refused.value.reason == "user"
    pid = lane.pid
    reply = lane.call("compare", {"config": _config(str(tiny_model_dir), "Capital of Norway?"), "out": str(tmp_path / "b")})
    assert reply.notice is None and lane.pid == pid and (tmp_path / "b" / "compare.json").is_file()
    assert [h["model"] for h in lane.status()["held"]] == [str(tiny_model_dir)]


@pytest.mark.model
@pytest.mark.e2e
@pytest.mark.slow
def test_two_callers_at_once_get_their_own_answers(lane, tiny_model_dir, tmp_path):
    answers = {}

    def ask(question):
        answers[question] = lane.call("compare", {"config": _config(str(tiny_model_dir), question),
                                                  "out": str(tmp_path / question[:5])}).result

    threads = [threading.Thread(target=ask, args=(q,)) for q in ("First question?", "Second question?")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert {q: a["questions"][0]["question"] for q, a in answers.items()} == {
        "First question?": "First question?", "Second question?": "Second question?"}


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.e2e
def test_a_killed_worker_fails_its_request_and_the_next_one_starts_anew(lane, tiny_model_dir, tmp_path):
    lane.call("held", {})
    first = lane.pid
    started = threading.Event()
    failure = {}

    def ask():
        try:
            lane.call("compare", {"config": _config(str(tiny_model_dir), *[f"Q{i}?" for i in range(60)]),
                                  "out": str(tmp_path / "killed")}, progress=lambda text: started.set())
        except LaneError as e:
            failure["error"] = e

    thread = threading.Thread(target=ask)
    thread.start()
    assert started.wait(60)
    os.kill(first, signal.SIGKILL)
    thread.join(60)
    assert failure["error"].reason == "died" and "SIGKILL" in str(failure["error"])
    reply = lane.call("compare", {"config": _config(str(tiny_model_dir), "After?"), "out": str(tmp_path / "after")})
    assert lane.pid != first and reply.result["questions"][0]["question"] == "After?"
    assert reply.notice is None  # the failed request already said it
    os.kill(lane.pid, signal.SIGKILL)  # killed between requests: the next answer says so
    time.sleep(0.5)
    reply = lane.call("held", {})
    assert "SIGKILL" in reply.notice and "new one was started" in reply.notice


@pytest.mark.model
@pytest.mark.e2e
def test_a_model_over_the_budget_is_refused_with_what_to_free(tmp_path, tiny_model_dir):
    lane = Lane(tmp_path / ".lane", device="cpu", memory_gb=0.0001, idle_s=120)  # the tiny model: 0.15 MiB
    try:
        with pytest.raises(LaneError, match=r"needs about .* MiB; the inference lane may hold 0.1 MiB .*--lane-memory") as e:
            lane.call("compare", {"config": _config(str(tiny_model_dir), "Q?"), "out": str(tmp_path / "a")})
        assert e.value.reason == "memory" and lane.status()["running"]
    finally:
        lane.stop()


@pytest.mark.e2e
@pytest.mark.slow
def test_an_idle_lane_exits_and_the_next_request_starts_it_quietly(tmp_path):
    lane = Lane(tmp_path / ".lane", device="cpu", idle_s=0.5)
    try:
        lane.call("held", {})
        first = lane.pid
        deadline = time.time() + 30
        while lane.pid is not None and time.time() < deadline:
            time.sleep(0.2)
        assert lane.pid is None
        reply = lane.call("held", {})
        assert reply.notice is None and lane.pid not in (None, first)
    finally:
        lane.stop()


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.e2e
def test_a_preload_warms_the_models_and_gives_them_back_when_idle(tmp_path, tiny_model_dir):
    """The Compare page's pre-load: the worker starts and loads the model in the background; the
    page's polls (last_status) do not keep it alive, and it exits after its idle timeout."""
    model = {"model": str(tiny_model_dir)}
    lane = Lane(tmp_path / ".lane", device="cpu", idle_s=2)
    try:
        warmup = lane.preload([model])
        assert warmup.models == (str(tiny_model_dir),) and warmup.expected_s is None
        assert lane.preload([model]) is None  # one at a time
        deadline = time.time() + 120
        while not warmup.done and time.time() < deadline:
            time.sleep(0.1)
        assert warmup.error is None and warmup.pid == lane.pid is not None
        assert [h["model"] for h in lane.last_status()["held"]] == [str(tiny_model_dir)]
        assert lane.preload([model]) is None  # a running lane is warm already
        while lane.pid is not None and time.time() < deadline:
            lane.last_status()  # the page's poll, here every 0.2 s: it must not keep the lane alive
            time.sleep(0.2)
        assert lane.pid is None and lane.last_status() == {"running": False}
        # kept for the next pre-load of the same models, whose line says "about N s"
        kept = json.loads((tmp_path / ".lane" / WARMUPS_NAME).read_text())
        assert kept == {str(tiny_model_dir): pytest.approx(warmup.seconds, abs=0.1)}
    finally:
        lane.stop()


# ---------------------------------------------------------------- the page, through the lane
@pytest.mark.model
@pytest.mark.e2e
@pytest.mark.slow
def test_the_page_compares_a_list_and_reopens_it_after_a_restart(tmp_path, tiny_model_dir):
    from ui import compare_page
    from ui.context import LabContext, LaneOptions

    runs = tmp_path / "runs"
    ctx = LabContext(runs, (tiny_model_dir.parent,), LaneOptions(device="cpu"))
    text = "Capital of Norway?\n*Oslo\nHelsinki\n\nSay something.\n\nPick one\nA) red\nB) blue"
    model = f"{tiny_model_dir}|"
    try:
        said = list(compare_page.run_compare(ctx, text, model, model, None, None, "", "2", "", ""))
    finally:
        ctx.lane.stop()
    assert "Starting the inference lane" in said[0][0] and any("model 2 of 2" in s[0] for s in said)
    message, picker, figure, answers, csv, result, history, status = said[-1]
    table = answers["value"]  # an update that also sets the columns' widths
    assert "Done in" in message and picker["visible"] and len(picker["choices"]) == 3
    assert len(table) == 6 and table["correct"].iloc[0] in (True, False) and Path(csv["value"]).is_file()
    assert [t.name for t in figure.data] == [str(tiny_model_dir), f"{tiny_model_dir} at T = 2"]
    assert compare_page.pick_question(result, 1) is None  # a free-text question: no bars
    assert "running on cpu" in status
    # A new server on the same folder: History lists it and reopens it whole.
    again = LabContext(runs, (tiny_model_dir.parent,))
    (label, name), = comparison_choices(runs)
    assert name == history["value"] and label.startswith("Capital of Norway? (+2 more)")
    reopened = compare_page.reopen(again, name)
    assert compare_page.parse_questions(reopened[0]) == compare_page.parse_questions(text)
    assert reopened[7:9] == (compare_page.gr.update(value=model), compare_page.gr.update(value=model))
    assert reopened[-4:-2] == ("", "2.0") and len(reopened[4]["value"]) == 6
    assert compare_page.reopen(again, "../../etc") == (compare_page.gr.skip(),) * 15
