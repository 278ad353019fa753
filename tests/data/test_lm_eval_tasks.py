"""lm-eval tasks as datasets (issue 40, lab.data.harness): the shipped tasks keep lm-eval's prompts, their
documents become records with lm-eval's own few-shot contexts, the lab's scores agree with lm-eval's own run
document by document on task YAMLs and data it has never seen, a group gives a row per subtask, and Submit
refuses what a task cannot be (naming the field, nothing queued) without running a line of a folder's code."""
from __future__ import annotations

import csv
import importlib.util
import json
import textwrap
from pathlib import Path

import numpy as np
import pytest

from lab.core.config import ConfigError
from lab.data import harness, hub_copy, load, samples
from lab.data.record import MCQRecord
from lab.kinds.evaluate.config import EvalConfig
from lab.jobkit.paths import checked_config
from ui.context import LabContext

REPO = Path(__file__).resolve().parents[2]
ARC_EASY = samples.ROOT / "arc_easy" / "dev.jsonl"
MARKER = "imported.txt"  # what a task folder's module writes when something imports it


# ---------------------------------------------------------------- task folders the lab has never seen


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _questions(n: int, seed: int) -> list[dict]:
    """Made-up four-option questions whose options differ in length (acc_norm then differs from acc)."""
    rng = np.random.default_rng(seed)
    words = ["river", "stone", "a small red bird", "the moon", "iron", "paper boats", "salt", "a very long winter"]
    return [{"q": f"Which of these is item {i}?", "options": [str(w) for w in rng.choice(words, 4, replace=False)],
             "gold": int(rng.integers(4))} for i in range(n)]


def _task_yaml(name: str, data: Path, **extra: str) -> str:
    lines = [f"task: {name}", "dataset_path: json", "dataset_kwargs:", "  data_files:", f"    test: {data}",
             "test_split: test", "output_type: multiple_choice", 'doc_to_text: "Q: {{q}}\\nA:"',
             'doc_to_choice: "{{options}}"', "doc_to_target: gold", "metric_list:", "  - metric: acc",
             "    aggregation: mean", "    higher_is_better: true", "  - metric: acc_norm", "    aggregation: mean",
             "    higher_is_better: true"]
    return "\n".join(lines + [f"{k}: {v}" for k, v in extra.items()]) + "\n"


WINO_UTILS = '''
def doc_to_text(doc):
    return {"1": 0, "2": 1}[doc["answer"]]


def doc_to_target(doc):
    return doc["sentence"][doc["sentence"].index("_") + 1:].strip()


def doc_to_choice(doc):
    idx = doc["sentence"].index("_")
    return [doc["sentence"][:idx] + opt for opt in (doc["option1"], doc["option2"])]
'''


def _wino_rows(n: int) -> list[dict]:
    names = [("Anna", "Boris"), ("the cat", "the dog"), ("Carla", "Dev"), ("the box", "the bag")]
    return [{"sentence": f"{a} thanked {b} because _ had helped with the work number {i}.", "option1": a,
             "option2": b, "answer": "2" if i % 3 else "1"} for i, (a, b) in enumerate(names * (n // 4 + 1))][:n]


@pytest.fixture
def folder(tmp_path) -> Path:
    """An include folder: a four-option task (``unseen_mc``, and ``unseen_zero``: the same, zero-shot by its
    YAML), a Winogrande-style multiple_input task
    (``unseen_wino``, its functions in utils.py as lm-eval's winogrande has them) and a group of two
    tasks over their own files (``unseen_group``); every data file an absolute path inside the folder."""
    root = tmp_path / "tasks"
    root.mkdir()
    data = _jsonl(root / "mc.jsonl", _questions(12, 0))
    (root / "unseen_mc.yaml").write_text(_task_yaml("unseen_mc", data))
    (root / "unseen_zero.yaml").write_text(_task_yaml("unseen_zero", data, num_fewshot="0"))
    (root / "utils.py").write_text(WINO_UTILS)
    wino = _jsonl(root / "wino.jsonl", _wino_rows(8))
    (root / "unseen_wino.yaml").write_text(textwrap.dedent(f"""\
        task: unseen_wino
        dataset_path: json
        dataset_kwargs:
          data_files:
            test: {wino}
        test_split: test
        output_type: multiple_choice
        doc_to_text: !function utils.doc_to_text
        doc_to_target: !function utils.doc_to_target
        doc_to_choice: !function utils.doc_to_choice
        metric_list:
          - metric: acc
            aggregation: mean
            higher_is_better: true
        """))
    for part, seed, n in (("a", 1, 5), ("b", 2, 7)):
        rows = _jsonl(root / f"part_{part}.jsonl", _questions(n, seed))
        (root / f"unseen_part_{part}.yaml").write_text(_task_yaml(f"unseen_part_{part}", rows))
    (root / "unseen_group.yaml").write_text("group: unseen_group\ntask:\n  - unseen_part_a\n  - unseen_part_b\n"
                                            "aggregate_metric_list:\n  - metric: acc\n    weight_by_size: true\n")
    return root


# ---------------------------------------------------------------- the shipped tasks


@pytest.mark.unit
def test_the_shipped_task_files_are_what_their_script_writes():
    spec = importlib.util.spec_from_file_location("make_lm_eval_tasks", REPO / "scripts" / "make_lm_eval_tasks.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main(["--check"]) == 0
    assert set(script.tasks()) == {p.name for p in harness.SHIPPED.iterdir() if p.suffix != ".py" and p.is_file()}


def _arc_rows(n: int | None) -> list[dict]:
    return [json.loads(line) for line in ARC_EASY.read_text(encoding="utf-8").splitlines()[:n]]


@pytest.mark.unit
def test_a_shipped_task_gives_the_sample_s_rows_with_lm_eval_s_zero_shot_prompt():
    loaded = load("lm-eval:bundled_arc_easy", limit=5)
    assert len(loaded.records) == 5 and loaded.problems == []
    assert loaded.tasks == {"bundled_arc_easy": {"shots": 0, "split": "validation", "n": 5,
                                               "metrics": ["acc", "acc_norm"]}}
    for doc_id, (record, row) in enumerate(zip(loaded.records, _arc_rows(5))):
        options = row["question"]["choices"]
        assert record.choices == tuple(c["text"] for c in options)
        assert record.answer == [c["label"] for c in options].index(row["answerKey"])
        assert record.meta == {"task": "bundled_arc_easy", "doc_id": doc_id}
        context = f"Question: {row['question']['stem']}\nAnswer:"
        assert record.requests == tuple((context, f" {c['text']}") for c in options)


@pytest.mark.unit
def test_few_shot_contexts_hold_k_solved_examples_and_never_the_scored_document():
    """fewshot_split is the scored split here, so lm-eval's sampler leaves the document itself out."""
    rows = _arc_rows(None)
    answers = {r["question"]["stem"]: next(c["text"] for c in r["question"]["choices"] if c["label"] == r["answerKey"])
               for r in rows}
    loaded = load("lm-eval:bundled_arc_easy", num_fewshot=3, limit=8)
    assert loaded.tasks["bundled_arc_easy"]["shots"] == 3
    contexts = set()
    for record, row in zip(loaded.records, rows):
        context = record.requests[0][0]
        blocks = context.split("\n\n")
        assert len(blocks) == 4 and blocks[-1] == f"Question: {row['question']['stem']}\nAnswer:"
        for shot in blocks[:3]:
            stem, answer = shot.removeprefix("Question: ").split("\nAnswer: ")
            assert stem != row["question"]["stem"] and answers[stem] == answer  # a solved example, not this one
        contexts.add("\n\n".join(blocks[:3]))
    assert len(contexts) > 1  # drawn per document, as lm-eval draws them
    again = load("lm-eval:bundled_arc_easy", num_fewshot=3, limit=8)
    assert [r.requests for r in again.records] == [r.requests for r in loaded.records]  # seeded


@pytest.mark.unit
def test_num_fewshot_none_keeps_the_task_s_default_and_a_number_overrides_it(folder):
    data = folder / "mc.jsonl"
    (folder / "unseen_mc.yaml").write_text(_task_yaml("unseen_mc", data, num_fewshot="2"))
    shots = {k: load("lm-eval:unseen_mc", include=str(folder), num_fewshot=k, limit=3) for k in (None, 0, 4)}
    assert {k: loaded.tasks["unseen_mc"]["shots"] for k, loaded in shots.items()} == {None: 2, 0: 0, 4: 4}
    for k, loaded in shots.items():
        assert all(r.requests[0][0].count("Q: ") == (2 if k is None else k) + 1 for r in loaded.records)


@pytest.mark.unit
def test_a_task_zero_shot_by_its_yaml_stays_zero_shot_whatever_num_fewshot_says(folder):
    """lm-eval's simple_evaluate never overrides a task's own ``num_fewshot: 0``; the lab asks for the same."""
    loaded = load("lm-eval:unseen_zero", include=str(folder), num_fewshot=3, limit=3)
    assert loaded.tasks["unseen_zero"]["shots"] == 0
    assert [r.requests[0][0] for r in loaded.records] == [f"Q: {q['q']}\nA:" for q in _questions(3, 0)]


@pytest.mark.unit
def test_the_bundled_mmlu_group_gives_its_57_subjects_five_shot_from_their_dev_files():
    loaded = load("lm-eval:bundled_mmlu", num_fewshot=5, limit=1)
    subjects = sorted(p.name.removesuffix("_val.csv") for p in (samples.ROOT / "mmlu" / "val").glob("*_val.csv"))
    assert len(subjects) == 57 and sorted(loaded.tasks) == [f"bundled_mmlu_{s}" for s in subjects]
    assert loaded.groups == {"bundled_mmlu": [f"bundled_mmlu_{s}" for s in subjects]}
    assert len(loaded.records) == 57 and len({r.id for r in loaded.records}) == 57
    record = next(r for r in loaded.records if r.meta["task"] == "bundled_mmlu_anatomy")
    with open(samples.ROOT / "mmlu" / "dev" / "anatomy_dev.csv", encoding="utf-8", newline="") as f:
        dev = list(csv.reader(f))
    shots = [f"{q.strip()}\nA. {a}\nB. {b}\nC. {c}\nD. {d}\nAnswer: {key}" for q, a, b, c, d, key in dev[:5]]
    context = record.requests[0][0]
    assert context.startswith("The following are multiple choice questions (with answers) about anatomy.\n\n")
    assert context.split("\n\n")[1:6] == shots  # first_n: the dev file's first five, in order
    assert [c for _, c in record.requests] == [" A", " B", " C", " D"]


@pytest.mark.unit
def test_prompts_of_gives_one_prompt_per_context_and_where_each_option_lands():
    plain = MCQRecord(id="p", question="q", choices=("x", "yy"), answer=0, source="t",
                      requests=(("Q:", " x"), ("Q:", " yy")))
    multi = MCQRecord(id="m", question="q", choices=("A went", "B went"), answer=1, source="t",
                      requests=(("A went", " home."), ("B went", " home.")))
    prompts, owners = harness.prompts_of([plain, multi])
    assert [(p.text, p.options, p.spaces) for p in prompts] == [
        ("Q:", (" x", " yy"), None), ("A went", (" home.",), None), ("B went", (" home.",), None)]
    assert owners == [[(0, 0), (0, 1)], [(1, 0), (2, 0)]]


@pytest.mark.unit
def test_a_multiple_input_task_s_records_carry_one_context_per_option(folder):
    loaded = load("lm-eval:unseen_wino", include=str(folder), limit=4)
    for record, row in zip(loaded.records, _wino_rows(4)):
        head, tail = row["sentence"].split("_")
        assert record.choices == (head + row["option1"], head + row["option2"])
        assert record.answer == int(row["answer"]) - 1
        assert record.requests == tuple((c, f" {tail.strip()}") for c in record.choices)


# ---------------------------------------------------------------- refused at submit, nothing queued, nothing run


@pytest.fixture
def server(tmp_path, folder, monkeypatch) -> LabContext:
    """A server that may read ``tmp_path/tasks`` (the include folder) and trusts it with code, offline."""
    monkeypatch.setenv(harness.TRUSTED_ENV, str(folder))
    monkeypatch.setattr(hub_copy, "hub_reachable", lambda: False)
    return LabContext(tmp_path / "runs", (folder,))


def _refused(ctx: LabContext, **config) -> str:
    """Submit ``config`` (an evaluate) from the browser; the refusal, after checking nothing was queued."""
    with pytest.raises(ConfigError) as refused:
        ctx.submit({"kind": "evaluate", "model": "bundled", **config})
    assert ctx.store.list() == []
    message = str(refused.value)
    for value in config.values():  # the user's own values aside, no server path a browser would see
        message = message.replace(repr(value), "<given>")
    assert str(ctx.runs.parent) not in message, message
    return message


def _evil(where: Path) -> Path:
    """A module that leaves a marker beside itself when imported."""
    path = where / "evil.py"
    path.write_text(f"from pathlib import Path\nPath(__file__).with_name({MARKER!r}).write_text('ran')\n"
                    "def fn(doc):\n    return 0\n")
    return path


@pytest.mark.unit
def test_a_task_from_a_trusted_folder_is_accepted_and_its_code_not_imported(server, folder):
    _evil(folder)
    (folder / "unseen_mc.yaml").write_text(_task_yaml("unseen_mc", folder / "mc.jsonl", process_docs="!function evil.fn"))
    job = server.submit({"kind": "evaluate", "model": "bundled", "dataset": "lm-eval:unseen_mc",
                         "lm_eval_include": str(folder), "num_fewshot": 2, "limit": 4})
    assert [j.id for j in server.store.list()] == [job.id]
    assert not (folder / MARKER).exists()  # indexed and checked from the YAML alone


@pytest.mark.unit
@pytest.mark.parametrize("task, expected", [
    ("unseen_gen", "dataset: lm-eval task 'unseen_gen' is a generate_until task"),
    ("unseen_roll", "dataset: lm-eval task 'unseen_roll' is a loglikelihood_rolling task"),
    ("unseen_gen_group", "dataset: lm-eval task 'unseen_gen' is a generate_until task"),  # a member of a group
    ("unseen_tag", "dataset: lm-eval task 'unseen_gen' is a generate_until task"),  # ... or of a tag
])
def test_a_task_that_is_not_multiple_choice_is_refused_naming_its_type(server, folder, task, expected):
    data = folder / "mc.jsonl"
    (folder / "gen.yaml").write_text(_task_yaml("unseen_gen", data, tag="[unseen_tag]").replace("multiple_choice",
                                                                                                "generate_until"))
    (folder / "roll.yaml").write_text(_task_yaml("unseen_roll", data).replace("multiple_choice",
                                                                               "loglikelihood_rolling"))
    (folder / "gen_group.yaml").write_text("group: unseen_gen_group\ntask:\n  - unseen_part_a\n  - unseen_gen\n")
    message = _refused(server, dataset=f"lm-eval:{task}", lm_eval_include=str(folder))
    assert message.startswith(expected) and "multiple_choice" in message, message


@pytest.mark.unit
def test_a_hub_task_on_an_offline_machine_is_refused_naming_its_dataset(server, folder):
    (folder / "hub.yaml").write_text(_task_yaml("unseen_hub", folder / "mc.jsonl").replace(
        "dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: " + str(folder / "mc.jsonl") + "\n",
        "dataset_path: someone/unseen_questions\n"))
    message = _refused(server, dataset="lm-eval:unseen_hub", lm_eval_include=str(folder))
    assert message.startswith("dataset: lm-eval task 'unseen_hub' reads dataset 'someone/unseen_questions' from "
                              "the Hugging Face hub"), message


@pytest.mark.unit
def test_an_include_folder_outside_the_allowed_ones_or_untrusted_is_refused(server, folder, tmp_path, monkeypatch):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    message = _refused(server, dataset="lm-eval:unseen_mc", lm_eval_include=str(outside))
    assert message.startswith("lm_eval_include: <given> leads outside the folders this server may read"), message
    monkeypatch.delenv(harness.TRUSTED_ENV)
    message = _refused(server, dataset="lm-eval:unseen_mc", lm_eval_include=str(folder))
    assert message.startswith("lm_eval_include:") and "not a folder this server trusts with code" in message
    assert "--trust-tasks" in message


@pytest.mark.unit
@pytest.mark.parametrize("name, text, expected", [
    ("fn_out.yaml", "task: x\ndoc_to_text: !function ../evil.fn\n", "fn_out.yaml line 2: '!function ../evil.fn'"),
    ("fn_os.yaml", "task: x\nprocess_docs: !function os.system\n", "fn_os.yaml line 2: '!function os.system'"),
    ("fn_dotted.yaml", "task: x\nprocess_docs: !function lab.evil.fn\n", "fn_dotted.yaml line 2: '!function lab"),
    ("inc_out.yaml", "include: ../outside.yaml\ntask: x\n", "inc_out.yaml: 'include: ../outside.yaml' leads outside"),
    ("bad.yaml", "task: x\ndoc_to_text: [unclosed\nother: 1\n", "bad.yaml: line 3 is not valid YAML"),
])
def test_a_folder_whose_yaml_could_run_code_outside_or_is_malformed_is_refused(server, folder, tmp_path, name,
                                                                               text, expected):
    _evil(tmp_path)  # beside the include folder, where '../evil' leads
    (tmp_path / "outside.yaml").write_text("task: y\n")
    (folder / name).write_text(text)
    message = _refused(server, dataset="lm-eval:unseen_mc", lm_eval_include=str(folder))
    assert message.startswith(f"lm_eval_include: tasks/{name}"), message
    assert expected in message, message
    assert not (tmp_path / MARKER).exists()


@pytest.mark.unit
@pytest.mark.parametrize("key", ["data_files", "data_dir"])
def test_data_a_task_yaml_names_outside_the_allowed_folders_is_refused(server, folder, tmp_path, key):
    secret = _jsonl(tmp_path / "secret.jsonl", _questions(3, 9))
    text = _task_yaml("unseen_leak", secret)
    if key == "data_dir":
        text = text.replace(f"  data_files:\n    test: {secret}\n", f"  data_dir: {tmp_path}\n")
    (folder / "leak.yaml").write_text(text)
    message = _refused(server, dataset="lm-eval:unseen_leak", lm_eval_include=str(folder))
    shown = ".../secret.jsonl" if key == "data_files" else f".../{tmp_path.name}"
    assert message.startswith(f"lm_eval_include: tasks/leak.yaml: {key} {shown!r}"), message
    assert "leads outside the folders this server may read" in message


@pytest.mark.unit
@pytest.mark.parametrize("config, field", [
    ({"dataset": "lm-eval:bundled_arc_easy", "scoring": "letter"}, "scoring"),
    ({"dataset": "lm-eval:bundled_arc_easy", "template": "cloze_plain"}, "template"),
    ({"dataset": "lm-eval:bundled_arc_easy", "subject": "anatomy"}, "subject"),
    ({"dataset": "lm-eval:bundled_arc_easy", "task": "clm"}, "task"),
    ({"dataset": "lm-eval:bundled_arc_easy", "fewshot_split": "train"}, "fewshot_split"),
    ({"dataset": "lm-eval:bad name!"}, "dataset"),
])
def test_fields_that_contradict_an_lm_eval_task_are_refused_naming_the_field(server, config, field):
    message = _refused(server, **config)
    assert message.startswith(f"{field}:"), message


@pytest.mark.unit
def test_data_files_with_an_lm_eval_task_is_refused(server, folder):
    message = _refused(server, dataset="lm-eval:bundled_arc_easy", data_files=[str(folder / "mc.jsonl")])
    assert message.startswith("data_files:") and "lm_eval_include" in message, message


# ---------------------------------------------------------------- the same answers as lm-eval, document by document


def _lm_eval_samples(model: Path, folder: Path, task: str, shots: int, limit: int) -> dict[str, list[dict]]:
    """lm-eval's own run of ``task`` from ``folder`` (its HF model, its requests, its metrics), per task."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=[str(folder)], include_defaults=False)
    out = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={model},dtype=float32", tasks=[task],
                                  task_manager=manager, num_fewshot=shots, limit=limit, log_samples=True,
                                  device="cpu", batch_size=8)
    return out["samples"]


def _lab_run(model: Path, folder: Path, task: str, shots: int, limit: int, out: Path) -> tuple[dict, list[dict]]:
    """The lab's evaluate of ``lm-eval:<task>`` as a job runs it: its metrics.json and predictions.jsonl."""
    from lab.kinds.evaluate.run import evaluate

    values = {"model": str(model), "dataset": f"lm-eval:{task}", "lm_eval_include": str(folder),
              "num_fewshot": shots, "limit": limit, "device": "cpu", "dtype": "float32", "batch_size": 8}
    evaluate(EvalConfig(**checked_config(EvalConfig, values)), out, log=lambda line: None)
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    return json.loads((out / "metrics.json").read_text()), rows


@pytest.mark.model
@pytest.mark.parametrize("task, shots", [  # the few-shot case in the fast tier, the others (~5 s each) in the full suite
    pytest.param("unseen_mc", 0, marks=pytest.mark.slow), ("unseen_mc", 3),
    pytest.param("unseen_wino", 2, marks=pytest.mark.slow), pytest.param("unseen_zero", 3, marks=pytest.mark.slow)])
def test_the_lab_agrees_with_lm_eval_document_by_document(tiny_model_dir, folder, tmp_path, task, shots):
    theirs = {s["doc_id"]: s for s in _lm_eval_samples(tiny_model_dir, folder, task, shots, 8)[task]}
    metrics, rows = _lab_run(tiny_model_dir, folder, task, shots, 8, tmp_path / "run")
    assert sorted(r["doc_id"] for r in rows) == sorted(theirs) == list(range(8))
    for row in rows:
        sample = theirs[row["doc_id"]]
        lls = np.array([resp[0] for resp in sample["filtered_resps"]])
        assert [tuple(a) for a in sample["arguments"]][0][0] == row["context"]
        np.testing.assert_allclose(row["logliks"], lls, atol=1e-4)
        assert row["pred"] == int(np.argmax(lls)) and float(row["correct"]) == sample["acc"]
        if "acc_norm" in sample:
            assert float(row["pred_norm"] == row["answer"]) == sample["acc_norm"]
    assert metrics["n"] == 8 and metrics["accuracy"] == pytest.approx(np.mean([s["acc"] for s in theirs.values()]))
    assert metrics["lm_eval"]["tasks"][task]["shots"] == (0 if task == "unseen_zero" else shots)
    assert 0 <= metrics["ece"] <= 1
    if task != "unseen_wino":  # options of unequal length: both scorings, each with its own ECE
        assert metrics["accuracy_norm"] == pytest.approx(np.mean([s["acc_norm"] for s in theirs.values()]))
        assert 0 <= metrics["ece_norm"] <= 1


@pytest.mark.model
def test_a_group_gives_a_result_per_subtask_and_the_pooled_group_row(tiny_model_dir, folder, tmp_path):
    metrics, rows = _lab_run(tiny_model_dir, folder, "unseen_group", 1, None, tmp_path / "run")
    assert metrics["lm_eval"]["groups"] == {"unseen_group": ["unseen_part_a", "unseen_part_b"]}
    assert {t: s["n"] for t, s in metrics["subtasks"].items()} == {"unseen_part_a": 5, "unseen_part_b": 7}
    assert metrics["n"] == 12 == len(rows)
    for task, sub in metrics["subtasks"].items():
        mine = [r for r in rows if r["task"] == task]
        assert sub["accuracy"] == pytest.approx(np.mean([r["correct"] for r in mine]))
        assert sub["shots"] == 1
    pooled = sum(s["accuracy"] * s["n"] for s in metrics["subtasks"].values()) / 12
    assert metrics["accuracy"] == pytest.approx(pooled)  # lm-eval's weight_by_size mean


# ---------------------------------------------------------------- against lm-eval's ~15,000 installed tasks (its index: ~13 s)

PROMPT_KEYS = ("output_type", "doc_to_text", "doc_to_choice", "doc_to_target", "target_delimiter", "fewshot_delimiter",
               "description", "fewshot_config", "num_fewshot", "process_docs")
MIRRORS = {"bundled_arc_easy": "arc_easy", "bundled_arc_challenge": "arc_challenge",
           "bundled_openbookqa": "openbookqa", "bundled_boolq": "boolq"}


@pytest.fixture(scope="module")
def installed():
    """lm-eval's own index of its installed tasks (a ``TaskManager``, read from the lab's cache once built)."""
    return harness.full_index()


def _yaml_of(index, name: str) -> dict:
    """A task's config as lm-eval reads it (includes resolved, !function left unimported)."""
    from lm_eval.tasks._yaml_loader import load_yaml

    return load_yaml(index.task_index[name].yaml_path, resolve_func=False)


def _shots_split(cfg: dict) -> str:
    """Where lm-eval draws a task's few-shot examples from (ConfigurableTask.fewshot_docs' order)."""
    return next(cfg[k] for k in ("fewshot_split", "training_split", "validation_split", "test_split") if cfg.get(k))


def _metric_names(cfg: dict) -> list[str]:
    return [m["metric"] for m in cfg.get("metric_list", [])]


@pytest.mark.unit
@pytest.mark.slow
def test_every_shipped_task_keeps_the_prompt_of_the_lm_eval_task_it_mirrors(installed):
    from lm_eval.tasks import TaskManager

    shipped = TaskManager(include_path=[str(harness.SHIPPED)], include_defaults=False)
    subjects = _yaml_of(shipped, "bundled_mmlu")["task"]
    pairs = {**MIRRORS, **{s: s.removeprefix("bundled_") for s in subjects}}
    assert len(pairs) == 4 + 57
    for ours, theirs in pairs.items():
        mine, lm = _yaml_of(shipped, ours), _yaml_of(installed, theirs)
        for key in PROMPT_KEYS:
            assert mine.get(key) == lm.get(key), (ours, key, mine.get(key), lm.get(key))
        assert _metric_names(mine) == _metric_names(lm), ours
        # the shots' split: lm-eval's, except where that is a training split the bundled sample lacks
        lacks_train = "training_split" not in mine and _shots_split(lm) == lm.get("training_split")
        assert _shots_split(mine) == _shots_split(lm) or lacks_train, ours


@pytest.mark.unit
@pytest.mark.slow
def test_an_unknown_task_is_refused_at_submit_with_the_closest_names(tmp_path):
    ctx = LabContext(tmp_path / "runs")
    with pytest.raises(ConfigError) as refused:
        ctx.submit({"kind": "evaluate", "model": "bundled", "dataset": "lm-eval:bundled_arc_eazy"})
    message = str(refused.value)
    assert message.startswith("dataset: unknown lm-eval task 'bundled_arc_eazy'"), message
    assert "Did you mean lm-eval:bundled_arc_easy" in message and ctx.store.list() == []


@pytest.mark.unit
def test_a_task_over_a_data_folder_inside_the_include_folder_is_offline(server, folder):
    """``dataset_path`` naming a folder of files (datasets reads it with its json builder) needs no hub."""
    (folder / "local").mkdir()
    _jsonl(folder / "local" / "test.jsonl", _questions(4, 3))
    (folder / "local.yaml").write_text(_task_yaml("unseen_local", folder / "mc.jsonl").replace(
        "dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: " + str(folder / "mc.jsonl") + "\n",
        "dataset_path: local\n"))
    server.submit({"kind": "evaluate", "model": "bundled", "dataset": "lm-eval:unseen_local",
                   "lm_eval_include": str(folder)})
    assert len(server.store.list()) == 1
    loaded = load("lm-eval:unseen_local", include=str(folder))
    assert [r.choices for r in loaded.records] == [tuple(q["options"]) for q in _questions(4, 3)]


@pytest.mark.unit
@pytest.mark.parametrize("pattern", ["data/linked.jsonl", "data/*.jsonl", "**/*.jsonl"])
def test_a_link_inside_the_include_folder_to_data_outside_is_refused_glob_or_not(server, folder, tmp_path, pattern):
    """A glob's own path stays inside the folder; the link it matches does not: the folder is refused for it."""
    secret = _jsonl(tmp_path / "secret.jsonl", _questions(3, 9))
    (folder / "data").mkdir()
    (folder / "data" / "linked.jsonl").symlink_to(secret)
    (folder / "leak.yaml").write_text(_task_yaml("unseen_leak", folder / "mc.jsonl").replace(
        f"test: {folder / 'mc.jsonl'}", f"test: {pattern}"))
    message = _refused(server, dataset="lm-eval:unseen_leak", lm_eval_include=str(folder))
    assert message.startswith("lm_eval_include:") and "leads outside the folders this server may read" in message


@pytest.mark.unit
@pytest.mark.parametrize("kind", ["finetune", "extract", "sft"])
def test_a_kind_that_trains_or_extracts_refuses_an_lm_eval_task_naming_where_they_go(kind):
    """Only the fields that declare it take lm-eval:<task>; elsewhere (training data, a teacher's top-k) the
    refusal says which fields do, rather than failing once the job starts."""
    from lab.core.config import ConfigError
    from lab.jobkit.kinds import parse_config

    with pytest.raises(ConfigError, match=r"^dataset: 'lm-eval:bundled_arc_easy': lm-eval:… names are taken by "
                                          r"evaluate, series tasks"):
        parse_config({"kind": kind, "dataset": "lm-eval:bundled_arc_easy"}, None)
