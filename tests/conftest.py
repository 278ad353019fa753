import functools
import json
import os
import shutil
import threading
from pathlib import Path

if os.environ.get("PYTEST_XDIST_WORKER"):
    # Parallel workers (`pytest -n N`: make test, test-fast, test-min) share two cores: one
    # torch thread each, and in the jobs, servers and ranks they start (the variable is inherited), is faster than
    # each oversubscribing them.
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest

from tests.browser.helpers import serving
from tests.helpers import make_tiny_model

KINDS = ("unit", "model", "e2e", "browser", "slurm")  # what a test does; `slow` (the fast tier's cut) is apart
# Kinds whose tests live in a folder of their own (pytest.ini's markers); the Slurm tests run in order on one worker
# under `--dist loadgroup`, since they share the one-node cluster they start (work_unit).
KIND_FOLDERS = {"browser": "tests/browser/", "slurm": "tests/slurm/"}
NEEDS = {"bundled": "model", "tiny_model_dir": "model", "served": "e2e", "served_bare": "e2e"}  # fixture: marker
# What a test is expected to take, in seconds, for `--dist loadgroup` to start the longest units first: the mean of
# each sort in a one-process run of the suite (2026-11-28, two cores): a slow browser test 52 s, another slow test
# 11 s, any other 0.2 s; a slow test on the real Slurm 40 s on three workers (2026-11-29: 35, 10 and 77 s, mostly
# waiting on Slurm). Counted as 10 s, the Slurm folder started last and ran alone for the suite's last 33 s.
EXPECTED_S = {"browser": 50.0, "slurm": 40.0, "slow": 10.0, "other": 0.2}


def _marker_problem(item) -> str | None:
    """Why ``item`` does not carry the markers that describe it (pytest.ini), or None: it needs one
    kind at least, `unit` alone, and `model` where it loads a model, `e2e` where it serves the app."""
    marks = {mark.name for mark in item.iter_markers()}
    kinds = marks & set(KINDS)
    needed = {NEEDS[name] for name in item.fixturenames if name in NEEDS}
    if not kinds:
        return f"no marker of {', '.join(KINDS)}"
    if "unit" in kinds and len(kinds) > 1:
        return f"marked unit beside {', '.join(sorted(kinds - {'unit'}))}"
    if needed - marks:
        return (f"uses {', '.join(n for n in item.fixturenames if n in NEEDS)} but is not marked "
                f"{', '.join(sorted(needed - marks))}")
    misplaced = [kind for kind, folder in KIND_FOLDERS.items() if kind in kinds and not item.nodeid.startswith(folder)]
    if misplaced:
        return f"marked {misplaced[0]} outside {KIND_FOLDERS[misplaced[0]]}, where its kind's tests live"
    return None


def _loadgroup(config) -> bool:
    return config.pluginmanager.hasplugin("xdist") and config.getvalue("dist") == "loadgroup"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup`` (README, Tests): the units :func:`work_unit` names, each run in order on one worker, handed
    out longest first (:func:`pytest_collection_modifyitems` orders them): a long test started last would leave one
    worker running alone at the end.
    pytest-xdist's own loadgroup reads ``xdist_group`` marks through a node id it rewrites, which pytest 9.2 no
    longer lets it do (pytest-dev/pytest-xdist#1386): here the unit comes from the path the node id carries."""
    if not _loadgroup(config):
        return None
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False  # keep the collection's order, which is longest first

    class Units(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return Units(config, log)


def work_unit(nodeid: str) -> str:
    """What ``--dist loadgroup`` runs in order on one worker with ``nodeid``: the Slurm folder for a Slurm test; its
    module for a test whose module builds a fixture once for all its tests (a model, a run, a page:
    ``scope="module"``), which another worker would build again; else the test alone."""
    module = nodeid.split("::")[0]
    if module.startswith(KIND_FOLDERS["slurm"]):
        return KIND_FOLDERS["slurm"]
    return module if _shares_a_fixture(module) else nodeid


@functools.cache
def _shares_a_fixture(module: str) -> bool:
    path = Path(__file__).parents[1] / module
    return path.is_file() and 'scope="module"' in path.read_text(encoding="utf-8")


def expected_s(item) -> float:
    """What ``item`` is expected to take (:data:`EXPECTED_S`), from its markers."""
    marks = {mark.name for mark in item.iter_markers()}
    if "slow" not in marks:
        return EXPECTED_S["other"]
    for kind in ("browser", "slurm"):
        if kind in marks:
            return EXPECTED_S[kind]
    return EXPECTED_S["slow"]


def longest_first(items: list) -> list:
    """``items`` with their work units in order of expected time, longest first, each unit's tests in their own order
    (a stable sort: every worker collects the same order, as xdist requires)."""
    units: dict[str, float] = {}
    for item in items:
        unit = work_unit(item.nodeid)
        units[unit] = units.get(unit, 0.0) + expected_s(item)
    return sorted(items, key=lambda item: -units[work_unit(item.nodeid)])


def pytest_collection_modifyitems(config, items):
    if _loadgroup(config):
        items[:] = longest_first(items)


def pytest_runtest_setup(item):
    """A test without the markers that describe it fails, saying which it lacks (the others run)."""
    problem = _marker_problem(item)
    if problem:
        pytest.fail(f"{item.nodeid}: {problem} (see pytest.ini's markers)", pytrace=False)


@pytest.fixture
def shared_data() -> Path:
    """The real dataset files in ../shared/data (see SOURCES.md there); skip where they are absent."""
    path = Path(__file__).resolve().parents[2] / "shared" / "data"
    if not path.is_dir():
        pytest.skip(f"shared data not found at {path}")
    return path


@pytest.fixture(scope="session")
def bundled():
    """The bundled SmolLM2-135M-Instruct, converted once per machine (about 30 s the first time)."""
    from lab.models.loading import load_model

    return load_model("bundled", device="cpu")


@pytest.fixture
def arc_records(shared_data):
    from lab.data import load

    return load("arc_challenge", "test", [str(shared_data / "arc_challenge" / "test.jsonl")], limit=6).records


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A 2-layer random Llama (width 32, context 512) with a 600-token tokenizer, made by lab.models.scratch
    (tests.helpers.make_tiny_model says from what): real loading, scoring and training code paths in
    seconds. Made once per session and shared: a test reads it, never writes into it."""
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def base_model_dir(tiny_model_dir, tmp_path_factory) -> Path:
    """The tiny model without a chat template: a base model, as the alignment-calibration paper tunes."""
    out = tmp_path_factory.mktemp("base") / "model"
    shutil.copytree(tiny_model_dir, out)
    (out / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((out / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out


@pytest.fixture(scope="session")
def slower_model_dir(tmp_path_factory) -> Path:
    """The tiny model made 4 layers deep and 256 wide (46 ms a training step on two cores, against 6 ms),
    for the tests whose job must still be running when they act on it: a kill between two checkpoints,
    a Slurm cancel, a Slurm time limit."""
    return make_tiny_model(tmp_path_factory.mktemp("slower") / "model", hidden=256, intermediate=1024, layers=4)


@pytest.fixture
def csqa_files(shared_data):
    return [f"train={shared_data / 'commonsenseqa' / 'train.jsonl'}", f"validation={shared_data / 'commonsenseqa' / 'dev.jsonl'}"]


def _serve(ctx):
    """The app for ``ctx`` with its scheduler on a free loopback port; yields its URL."""
    from jobs.scheduler import Scheduler

    stop = threading.Event()
    threading.Thread(target=Scheduler(ctx.store).run_forever, args=(stop, 0.2), daemon=True).start()
    try:
        with serving(ctx) as url:
            yield url
    finally:
        stop.set()


@pytest.fixture
def served(tmp_path, shared_data, bundled):
    """The app with its scheduler, on a free loopback port; ``../shared/data`` allowed."""
    from ui.context import LabContext

    ctx = LabContext(tmp_path / "runs", (shared_data,))
    for url in _serve(ctx):
        yield ctx, url


@pytest.fixture
def served_bare(tmp_path):
    """The app on an empty runs folder, no extra folders allowed, no model loaded."""
    from ui.context import LabContext

    ctx = LabContext(tmp_path / "runs")
    for url in _serve(ctx):
        yield ctx, url


@pytest.fixture(scope="session")
def chromium():
    """One headless Chromium for the test process, each test's pages in a context of their own
    (:func:`tests.browser.helpers.open_page`): a Chromium and Playwright's driver launched for each test
    cost about 1.4 s of CPU, a context 0.3 s, and the browser tests share two cores with jobs."""
    from tests.browser.helpers import launch

    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        browser = launch(p)
        yield browser
        browser.close()


@pytest.fixture
def new_page(chromium):
    """``new_page(height=1000, width=1440)``: a page in the process's Chromium, in a fresh context closed
    after the test."""
    from tests.browser.helpers import open_page

    pages = []

    def make(height: int = 1000, width: int = 1440):
        pages.append(open_page(chromium, height=height, width=width))
        return pages[-1]

    yield make
    for page in pages:
        page.context.close()


@pytest.fixture
def newcomer(served_bare, bundled, new_page, monkeypatch):
    """A browser on the app as a user's machine runs it: nothing but the package, no hub."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return new_page(height=1000), served_bare
