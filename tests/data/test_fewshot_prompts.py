"""Few-shot examples for the lab's own datasets (issue 40, item 2): the prompt lm-eval would build, written out by
hand; the seeded draw; never a scored question; the ids a run stores; what is refused at submit; a run without
num_fewshot as before; and an evaluation of the tiny model with examples."""
import json

import pytest

from lab.core.config import ConfigError
from lab.core.errors import DataError
from lab.data import load
from lab.data.fewshot_prompts import with_shots
from lab.data.record import MCQRecord
from lab.data.templates import Prompt, get_template, template_names
from lab.jobkit.kinds import parse_config
from lab.kinds.evaluate import fewshot
from lab.kinds.evaluate.config import EvalConfig
from lab.kinds.evaluate.run import _prompts, evaluate

ORGAN = MCQRecord("s1", "Largest organ?", ("skin", "liver", "heart", "lung"), 0, "t", meta={"subject": "anatomy"})
SUM = MCQRecord("s2", "What is 1+1?", ("1", "2", "3", "4"), 1, "t", meta={"subject": "anatomy"})
BONE = MCQRecord("q1", "Which bone?", ("femur", "ulna", "skull", "rib"), 0, "t", meta={"subject": "anatomy"})
LISTED = {"ORGAN": "A. skin\nB. liver\nC. heart\nD. lung", "SUM": "A. 1\nB. 2\nC. 3\nD. 4",
          "BONE": "A. femur\nB. ulna\nC. skull\nD. rib"}


def _config(**values) -> EvalConfig:
    return parse_config({"kind": "evaluate", "bootstrap": 0, **values})[1]


def _shot_prompt(template: str, record: MCQRecord = BONE, shots=(ORGAN, SUM)) -> Prompt:
    render = get_template(template).render
    return with_shots(render(record, None), [(render(s, None), s.answer) for s in shots], template)


def _refusal(**values) -> str:
    with pytest.raises(ConfigError) as e:
        _config(**values)
    return str(e.value)


def _rows(out) -> list[dict]:
    return [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]


# ---------------------------------------------------------------- rendering


@pytest.mark.unit
def test_two_shots_before_a_letter_question_as_lm_eval_mmlu_writes_them():
    """MMLU's description once, then each example with its answer letter, blank lines between (lm-eval's mmlu)."""
    prompt = _shot_prompt("mmlu")
    assert prompt.text == ("The following are multiple choice questions (with answers) about anatomy.\n\n"
                           f"Largest organ?\n{LISTED['ORGAN']}\nAnswer: A\n\n"
                           f"What is 1+1?\n{LISTED['SUM']}\nAnswer: B\n\n"
                           f"Which bone?\n{LISTED['BONE']}\nAnswer:")
    assert prompt.options == (" A", " B", " C", " D")


@pytest.mark.unit
def test_two_shots_before_a_cloze_question_and_a_template_with_a_suffix():
    assert _shot_prompt("cloze_qa").text == ("Question: Largest organ?\nAnswer: skin\n\n"
                                             "Question: What is 1+1?\nAnswer: 2\n\n"
                                             "Question: Which bone?\nAnswer:")
    assert _shot_prompt("cloze_plain").options == (" femur", " ulna", " skull", " rib")
    first = _shot_prompt("first").text  # FIRST's target closes the sentence: "(A)."
    assert first.startswith("Q: Largest organ? Answer Choices: (A) skin (B) liver (C) heart (D) lung A: The answer is "
                            "(A).\n\nQ: What is 1+1?")
    assert first.endswith("\n\nQ: Which bone? Answer Choices: (A) femur (B) ulna (C) skull (D) rib A: The answer is (")


@pytest.mark.unit
def test_no_shots_is_the_prompt_itself_and_a_chat_prompt_takes_none():
    plain = get_template("cloze_qa").render(BONE, None)
    assert with_shots(plain, []) is plain
    chat = Prompt("<|user|>Which bone?<|assistant|>", (" A", " B"), chat=True)
    with pytest.raises(DataError, match="chat template, so few-shot examples cannot go before it"):
        with_shots(chat, [(plain, 0)], "cft_chat")


@pytest.mark.unit
@pytest.mark.parametrize("template", template_names("letter") + template_names("cloze"))
def test_without_num_fewshot_the_prompts_are_each_templates_own(template):
    """num_fewshot None: the scorer gets exactly what the template renders, as before few-shot existed."""
    scoring = get_template(template).kind
    cfg = _config(dataset="obqa", split="test", scoring=scoring, template=template, limit=5)
    records = load("obqa", "test", ["bundled"], limit=5).records
    assert fewshot.draw(cfg, records) is None
    assert _prompts(cfg, records, None, None)[0] == [get_template(template).render(r, None) for r in records]


# ---------------------------------------------------------------- the draw


@pytest.mark.unit
def test_the_draw_is_seeded_the_same_for_every_question_and_stored():
    scored = load("obqa", "test", ["bundled"], limit=6).records
    draws = {seed: fewshot.draw(_config(dataset="obqa", split="test", num_fewshot=3, seed=seed), scored, log=lambda m: None)
             for seed in (0, 1)}
    again = fewshot.draw(_config(dataset="obqa", split="test", num_fewshot=3, seed=0), scored, log=lambda m: None)
    assert again.info == draws[0].info and draws[0].info["ids"] != draws[1].info["ids"]
    assert {"num_fewshot": 3, "split": "train", "seed": 0}.items() <= draws[0].info.items()
    train_ids = {r.id for r in load("obqa", "train", ["bundled"]).records}
    assert set(draws[0].info["ids"]) <= train_ids and len(set(draws[0].info["ids"])) == 3
    assert all([s.id for s in draws[0].of(r)] == draws[0].info["ids"] for r in scored)


@pytest.mark.unit
@pytest.mark.parametrize("seed", range(6))
def test_a_scored_question_is_never_an_example(tmp_path, seed):
    """A pool record with a scored id is left out even where the files hold both (split names aside)."""
    rows = [{"id": f"r{i}", "question": f"Question {i}?", "choices": ["yes", "no"], "answer": i % 2} for i in range(6)]
    (tmp_path / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:4]))
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))  # r0..r3 are scored ones
    values = {"dataset": "custom", "split": "test", "seed": seed,
              "data_files": [f"test={tmp_path / 'test.jsonl'}", f"train={tmp_path / 'train.jsonl'}"]}
    scored = load("custom", "test", values["data_files"]).records
    drawn = fewshot.draw(_config(**values, num_fewshot=2), scored, log=lambda m: None)
    assert drawn.info["ids"] in (["r4", "r5"], ["r5", "r4"])
    with pytest.raises(DataError, match="num_fewshot: 3 examples asked for, but fewshot_split 'train' of custom holds 2"):
        fewshot.draw(_config(**values, num_fewshot=3), scored)


@pytest.mark.unit
def test_mmlu_draws_each_subjects_examples_from_its_own_dev_questions():
    cfg = _config(dataset="mmlu", split="validation", scoring="letter", num_fewshot=5)
    scored = load("mmlu", "validation", ["bundled"]).records[::40]
    shots = fewshot.draw(cfg, scored, log=lambda m: None)
    assert cfg.fewshot_split == "dev" and "ids" not in shots.info
    by_subject = shots.info["ids_by_subject"]
    assert set(by_subject) == {r.meta["subject"] for r in scored}
    for record in scored:
        examples = shots.of(record)
        assert len(examples) == 5 and {e.meta["subject"] for e in examples} == {record.meta["subject"]}
        assert [e.id for e in examples] == by_subject[record.meta["subject"]]
    prompt = _prompts(cfg, scored[:1], None, shots)[0][0].text
    assert prompt.count("The following are multiple choice questions") == 1 and prompt.count("\nAnswer:") == 6


# ---------------------------------------------------------------- refused at submit


@pytest.mark.unit
@pytest.mark.parametrize("values, said", [
    ({"dataset": "obqa", "split": "test", "fewshot_split": "train"}, "fewshot_split: 'train' is where few-shot "
     "examples come from, and num_fewshot asks for none"),
    ({"dataset": "obqa", "split": "test", "num_fewshot": 2, "fewshot_split": "bogus"}, "fewshot_split: Unknown split "
     "'bogus'"),
    ({"dataset": "obqa", "split": "test", "num_fewshot": 2, "fewshot_split": "test"}, "fewshot_split: 'test' reads the "
     "questions split 'test' scores"),
    ({"dataset": "obqa", "split": "train", "num_fewshot": 2}, "fewshot_split: 'train' reads the questions split 'train'"),
    ({"dataset": "arc_easy", "split": "validation", "num_fewshot": 2, "fewshot_split": "validation:train"},
     "split 'validation:test' with fewshot_split 'validation:train'"),
    ({"dataset": "arc_easy", "num_fewshot": 2}, "fewshot_split: the bundled sample of arc_easy has no 'train' split"),
    ({"dataset": "obqa", "split": "test", "num_fewshot": 2, "scoring": "letter", "template": "cft_chat"},
     "num_fewshot: template 'cft_chat' puts each question in the model's chat template"),
    ({"task": "clm", "num_fewshot": 2}, "num_fewshot: few-shot examples go before multiple-choice questions"),
    ({"dataset": "lm-eval:bundled_arc_easy", "num_fewshot": 2, "fewshot_split": "train"},
     "fewshot_split: an lm-eval task draws its examples from its YAML's fewshot_split"),
])
def test_refused_at_submit_naming_the_field(values, said):
    assert said in _refusal(**values)


@pytest.mark.unit
def test_a_data_file_without_a_split_is_refused_as_every_splits_rows(tmp_path):
    questions = tmp_path / "questions.jsonl"
    questions.write_text(json.dumps({"question": "Sky?", "choices": ["red", "blue"], "answer": 1}) + "\n")
    said = _refusal(dataset="custom", split="test", num_fewshot=2, data_files=[str(questions)])
    assert said.startswith("fewshot_split: the data files name no split (PATH, not SPLIT=PATH)")
    assert "name each file's split (test=PATH, train=PATH)" in said and str(tmp_path) not in said
    assert _config(dataset="custom", split="test:test", fewshot_split="test:train", num_fewshot=2,
                   data_files=[str(questions)]).fewshot_split == "test:train"


@pytest.mark.unit
def test_accepted_splits_are_stored_resolved():
    assert _config(dataset="obqa", split="test", num_fewshot=2).fewshot_split == "train"
    assert _config(dataset="obqa", split="test", num_fewshot=0).fewshot_split is None
    carved = _config(dataset="arc_easy", split="validation:test", num_fewshot=2, fewshot_split="dev:train")
    assert (carved.split, carved.fewshot_split) == ("validation:test", "dev:train")


# ---------------------------------------------------------------- runs


@pytest.mark.model
def test_an_evaluation_with_examples_stores_them_and_none_is_as_before(tiny_model_dir, tmp_path):
    common = {"model": str(tiny_model_dir), "dataset": "obqa", "split": "test", "limit": 6, "device": "cpu",
              "dtype": "float32"}
    runs = {}
    for name, shots in (("none", None), ("zero", 0), ("two", 2)):
        evaluate(_config(**common, num_fewshot=shots), tmp_path / name, log=lambda m: None)
        runs[name] = (json.loads((tmp_path / name / "metrics.json").read_text()), _rows(tmp_path / name))
    assert (tmp_path / "none" / "predictions.jsonl").read_bytes() == (tmp_path / "zero" / "predictions.jsonl").read_bytes()
    assert "fewshot" not in runs["none"][0] and "fewshot" not in runs["zero"][0]
    stored = runs["two"][0]["fewshot"]
    assert stored["split"] == "train" and stored["seed"] == 0 and len(stored["ids"]) == 2
    assert not set(stored["ids"]) & {row["id"] for row in runs["two"][1]}
    assert [r["id"] for r in runs["two"][1]] == [r["id"] for r in runs["none"][1]]
    assert [r["probs"] for r in runs["two"][1]] != [r["probs"] for r in runs["none"][1]]


@pytest.mark.model
def test_examples_past_the_context_are_refused_saying_to_lower_num_fewshot(tiny_model_dir, tmp_path):
    cfg = _config(model=str(tiny_model_dir), dataset="obqa", split="test", limit=2, num_fewshot=40, device="cpu")
    with pytest.raises(DataError, match="not fit in the model's context of 512 tokens.*lower num_fewshot"):
        evaluate(cfg, tmp_path / "run", log=lambda m: None)


@pytest.mark.unit
def test_a_lab_datasets_shots_are_named_and_tell_tasks_apart():
    from lab.results.series import dataset_label
    from lab.results.stages import TASK_FIELDS

    assert dataset_label("obqa", "test", 2) == "obqa/test (2-shot)"
    assert dataset_label("obqa", "test", 0) == dataset_label("obqa", "test", None) == "obqa/test"
    assert {"num_fewshot", "fewshot_split"} <= set(TASK_FIELDS)


@pytest.mark.unit
def test_results_name_a_lab_dataset_run_by_its_shots(tmp_path):
    """Results, Life cycle and the job page read a run's label through runs.py: a 3-shot run of a lab dataset
    says so, as an lm-eval run does, and a zero-shot one says nothing more."""
    from lab.results.run_metrics import shots_of
    from lab.results.runs import EvalRun

    assert shots_of({"fewshot": {"num_fewshot": 3, "split": "train"}}) == ("3", None)
    assert shots_of({"dataset": "obqa"}) == (None, None)
    run = EvalRun(path=tmp_path, name="r", model="bundled", dataset="obqa", split="test", n=10, shots="3")
    assert run.dataset_label == "obqa (3-shot)" and "3-shot" in run.label
