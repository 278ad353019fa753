"""Pre-flight at submit (issue 31): a job's GPU memory and its checkpoints' disk, counted with the
trainer's settings wherever a kind keeps them, said when it is queued (form and command line), and a
job whose checkpoints will not fit on the runs folder's disk refused, naming both sizes."""
import shutil
from pathlib import Path

import pytest
import yaml

from jobs import preflight
from jobs.cli import main as jobs_cli
from jobs.store import JobStore
from lab.core.config import ConfigError
from lab.jobkit.kinds import parse_config
from lab.models.weights import count_parameters, model_shape, size_text
from lab.training.estimates import CHECKPOINT_EXTRA, GPU, training_memory
from ui import forms, launch_page
from ui.context import LabContext
from ui.messages import note

pytestmark = pytest.mark.model


@pytest.fixture
def low_disk(monkeypatch, tmp_path):
    """The runs folder's disk with ``free[0]`` bytes free (every other path as it is)."""
    real, free = shutil.disk_usage, [0]
    monkeypatch.setattr(shutil, "disk_usage", lambda path: real(path)._replace(free=free[0])
                        if str(path).startswith(str(tmp_path / "runs")) else real(path))
    return free


def _finetune(tiny_model_dir, csqa_files, **fields) -> dict:
    return {"kind": "finetune", "model": str(tiny_model_dir), "dataset": "csqa", "data_files": csqa_files,
            "limit": 8, **fields}


def test_a_pipeline_is_counted_with_its_training_section(tiny_model_dir):
    config = {"kind": "cft", "model": str(tiny_model_dir),
              "training": {"method": "lora", "batch_size": 2, "max_length": 64, "lora_r": 4, "save_optimizer": False}}
    _, cfg = parse_config(config)
    (plan,) = preflight.plan("cft", cfg.to_dict())
    shape = model_shape(tiny_model_dir)
    assert plan.memory == training_memory(shape, "lora", 2, 64, GPU, 2, lora_r=4, lora_dropout=0.05).peak
    assert plan.checkpoint == 4 * shape.lora_params(4) + CHECKPOINT_EXTRA  # the fp32 adapter, no optimizer state
    assert preflight.training_settings("finetune", {})["save_optimizer"] is True  # defaults filled


def test_lora_targets_are_counted_and_one_the_model_lacks_is_refused_at_submit(tiny_model_dir, csqa_files, tmp_path):
    """Only the named layers' adapters in the estimate; a misspelt name refused before the job waits in the
    queue, naming the field and the layers there are (a pipeline's in its training section)."""
    config = {"kind": "cft", "model": str(tiny_model_dir),
              "training": {"method": "lora", "lora_r": 4, "lora_targets": ["q_proj", "v_proj"], "max_length": 64}}
    (plan,) = preflight.plan("cft", parse_config(config)[1].to_dict())
    shape = model_shape(tiny_model_dir)
    assert plan.final == 4 * shape.lora_params(4, ["q_proj", "v_proj"]) < 4 * shape.lora_params(4) / 3
    assert plan.memory == training_memory(shape, "lora", 8, 64, GPU, 2, 4, 0.05,
                                          lora_targets=["q_proj", "v_proj"]).peak
    store = JobStore(tmp_path / "runs")
    listed = "down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj"
    with pytest.raises(ConfigError, match=f"^lora_targets: model \\({tiny_model_dir}\\) has no linear layer named "
                                          f"v_prj; its linear layers are {listed} \\(or all-linear for every one\\)$"):
        store.submit(_finetune(tiny_model_dir, csqa_files, method="lora", lora_targets=["q_proj", "v_prj"]))
    with pytest.raises(ConfigError, match=r"^training.lora_targets: model \(.*\) has no linear layer named qv;"):
        store.submit({**config, "training": {**config["training"], "lora_targets": ["qv"]}})
    assert store.list() == []
    assert store.submit(_finetune(tiny_model_dir, csqa_files, lora_targets=["qv"])).status == "queued"  # full: unused


def test_the_start_warning_counts_the_trainer_and_the_cuda_context(tiny_model_dir, csqa_files):
    _, cfg = parse_config(_finetune(tiny_model_dir, csqa_files))
    peak = training_memory(model_shape(tiny_model_dir), "full", 8, 512).peak  # batch_size, max_length defaults
    assert preflight.check("finetune", cfg.to_dict(), (0,), free={0: peak + preflight.CUDA_CONTEXT}) == []
    (warning,) = preflight.check("finetune", cfg.to_dict(), (0,), free={0: peak})
    assert warning.startswith("model: ") and "full, batches of 8 × 512 tokens (max_length)" in warning
    assert f"needs about {(peak + preflight.CUDA_CONTEXT) / 1024**3:.1f} GiB per GPU at its peak" in warning


def test_submit_refuses_checkpoints_that_will_not_fit_naming_needed_and_free(tiny_model_dir, csqa_files, tmp_path,
                                                                           low_disk):
    n = count_parameters(tiny_model_dir)
    checkpoint = 12 * n + CHECKPOINT_EXTRA  # fp32 weights and AdamW's moments
    need = 2 * checkpoint  # one kept, and the next written beside it before it goes
    store = JobStore(tmp_path / "runs")
    low_disk[0] = need - 1
    with pytest.raises(ConfigError) as refused:
        store.submit(_finetune(tiny_model_dir, csqa_files))
    weights_only = 2 * (4 * n + CHECKPOINT_EXTRA)
    assert str(refused.value) == (
        f"save_optimizer: the checkpoints need {size_text(need)} of disk at once (1 kept, a new one written "
        f"beside it, and the trained weights), but the disk of runs/ has {size_text(need - 1)} free: free space; "
        f"save_optimizer: false (weights only) needs {size_text(weights_only)}")
    # The field it names is where each kind keeps it: sft's own (the form marks it), a pipeline's training section.
    for config, field in (({"kind": "sft", "model": str(tiny_model_dir)}, "save_optimizer"),
                          ({"kind": "cft", "model": str(tiny_model_dir)}, "training.save_optimizer")):
        with pytest.raises(ConfigError, match=f"^{field}: the checkpoints need "):
            store.submit(config)
    assert store.list() == []
    assert store.submit(_finetune(tiny_model_dir, csqa_files, save_optimizer=False)).status == "queued"
    low_disk[0] = need
    assert store.submit(_finetune(tiny_model_dir, csqa_files)).status == "queued"


def test_the_command_line_says_what_a_job_will_take(tiny_model_dir, csqa_files, tmp_path, capsys):
    path = tmp_path / "finetune.yaml"
    path.write_text(yaml.safe_dump(_finetune(tiny_model_dir, csqa_files, method="lora")))
    assert jobs_cli(["--root", str(tmp_path / "runs"), "submit", str(path)]) == 0
    out, err = capsys.readouterr()
    assert out.strip().isdigit()  # stdout: the job id alone, for scripts
    checkpoint = 12 * model_shape(tiny_model_dir).lora_params(16) + CHECKPOINT_EXTRA
    assert (f"checkpoints: model {size_text(checkpoint)} each (with the optimizer's state), 1 kept; "
            f"{size_text(2 * checkpoint)} of disk at once with the trained weights") in err


def test_the_form_says_what_a_job_will_take(tiny_model_dir, csqa_files, shared_data, tmp_path):
    ctx = LabContext(tmp_path / "runs", allowed=(tiny_model_dir.parent, shared_data))
    names = [f.name for f in forms.fields("finetune")]
    values = forms.preset_values("finetune", None)
    for name, value in {"model": str(tiny_model_dir), "dataset": "csqa", "data_files": "\n".join(csqa_files)}.items():
        values[names.index(name)] = value
    said = launch_page.submit_form(ctx, "finetune", 0, 1, *values)
    assert "queued (finetune)" in said
    checkpoint = 12 * count_parameters(tiny_model_dir) + CHECKPOINT_EXTRA
    assert note(f"checkpoints: model {size_text(checkpoint)} each (with the optimizer's state), 1 kept; "
                f"{size_text(2 * checkpoint)} of disk at once with the trained weights") in said


def test_the_job_page_shows_the_estimate_the_worker_made(tiny_model_dir, csqa_files, tmp_path):
    from lab.core.events import EventWriter
    from lab.training.config import TrainConfig
    from lab.training.trainer import finetune
    from ui.jobs_page import job_view

    ctx = LabContext(tmp_path / "runs")
    config = _finetune(tiny_model_dir, csqa_files, limit=4, epochs=1, batch_size=4, val_split=None)
    job = ctx.store.submit(config)
    run_dir = Path(job.run_dir)
    finetune(TrainConfig.from_dict({k: v for k, v in config.items() if k != "kind"}), run_dir,
             EventWriter(run_dir / "events.jsonl"))
    text = job_view(ctx, job.id).text
    assert "Memory (estimate): train: about " in text and " of RAM at the peak, batches of 4 × " in text


def test_lora_targets_typed_one_a_line_on_the_form_reach_the_job_and_a_misspelt_one_is_marked(tiny_model_dir,
                                                                                              tmp_path):
    """The form's lora_targets box: a name a line is the job's list; a name the model lacks is refused at submit,
    the box marked with the message and "More options" opened."""
    ctx = LabContext(tmp_path / "runs", allowed=(tiny_model_dir.parent,))
    names = [f.name for f in forms.fields("sft")]

    def submit(targets: str):
        values = forms.preset_values("sft", None)
        for name, text in {"model": str(tiny_model_dir), "method": "lora", "calibration": "",
                           "lora_targets": targets}.items():
            values[names.index(name)] = text
        return launch_page.submit_and_mark(ctx, "sft", "0", "1", "local", "", "1", "0", "30", "", "", *values)

    message, *marks, more = submit("q_proj\nv_prj")
    assert "lora_targets: model" in message and "has no linear layer named v_prj" in message, message
    assert marks[names.index("lora_targets")]["elem_classes"] == [launch_page.REFUSED] and more["open"] is True, message
    assert ctx.store.list() == []
    message, *_ = submit(" q_proj\n\nv_proj ")
    assert "queued" in message and ctx.store.list()[0].config_dict["lora_targets"] == ["q_proj", "v_proj"]


@pytest.mark.parametrize("kind, once", [("finetune", True), ("sft", True), ("dpo", True), ("cft", False)])
def test_only_a_pipeline_is_said_to_need_at_least_the_disk_counted(kind, once, tiny_model_dir):
    """A pipeline trains a model more than once: its disk is a lower bound. An sft or dpo job trains one."""
    (line,) = [n for n in preflight.submit_notes(kind, {"model": str(tiny_model_dir)}, 0) if n.startswith("checkpoints")]
    assert line.endswith("with the trained weights" if once else "(at least: a pipeline trains a model more than once)")
