"""The Launch form's "Plan memory and disk": the dry run of the form's config on the GPUs asked for, before
anything is queued or downloaded; refusals as Submit's, naming the field."""
import shutil
from pathlib import Path

import pytest

from jobs import preflight
from lab.models.weights import SHIPPED_CONFIGS
from tests.helpers import form_values
from ui import launch_page, plan_view
from ui.context import LabContext

pytestmark = pytest.mark.unit

GIB = 1024**3


@pytest.fixture
def config_only(tmp_path) -> Path:
    """A folder with only LLaMA-2-7B's config.json, under the runs folder the form may read."""
    folder = tmp_path / "runs" / "llama-2-7b"
    folder.mkdir(parents=True)
    shutil.copy(SHIPPED_CONFIGS / "meta-llama" / "Llama-2-7b-hf" / "config.json", folder)
    return folder


def test_the_plan_shows_a_7b_full_fine_tune_sharded_and_unsharded(tmp_path, config_only, monkeypatch):
    monkeypatch.setattr(preflight, "free_gpu_memory", lambda: {})
    ctx = LabContext(tmp_path / "runs")
    values = form_values("finetune", model=str(config_only), method="full", sharding="fsdp")
    shown = launch_page.plan_form(ctx, "finetune", "8", *values)
    assert "Plan for 8 GPU(s) against a 80 GiB GPU (this machine has none)" in shown
    assert "6.74 B, full" in shown and "nothing queued" in shown
    assert "runs/llama-2-7b (6.74 B" in shown and str(tmp_path) not in shown  # the folder, not the server's path
    assert ctx.store.list() == []  # nothing queued
    one = launch_page.plan_form(ctx, "finetune", "1", *form_values("finetune", model=str(config_only),
                                                                     method="full"))
    assert "<b>no</b>" in one and "To fit, " in one and "sharding: fsdp" in one  # unsharded 7B: the advice


def test_the_plan_refuses_as_submit_does(tmp_path, config_only):
    ctx = LabContext(tmp_path / "runs")
    refused = launch_page.plan_form(ctx, "finetune", "-1", *form_values("finetune", model=str(config_only)))
    assert "lab-error" in refused and "gpus" in refused
    refused = launch_page.plan_form(ctx, "finetune", "1", *form_values("finetune", model="/etc"))
    assert "lab-error" in refused and "model: " in refused and "leads outside" in refused


def test_the_budget_is_the_least_free_gpu_here():
    assert plan_view.gpu_budget({0: 40 * GIB, 1: 20 * GIB})[0] == 20 * GIB
    assert plan_view.gpu_budget({})[0] == 80 * GIB
