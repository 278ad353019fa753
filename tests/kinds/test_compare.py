"""Several models on the user's questions (the compare job and the lane's compare), with the bundled model."""
import json

import numpy as np
import pytest

from lab.calibration.temperature import scale
from lab.data.record import MCQRecord
from lab.data.templates import get_template
from lab.kinds.compare.config import CompareConfig
from lab.kinds.compare.questions import format_questions, parse_questions
from lab.kinds.compare.result import history_dir, read_result, rows
from lab.kinds.compare.run import compare
from lab.models.scoring import score_letter


@pytest.mark.model
def test_compare_scores_options_applies_temperatures_and_generates(bundled, tmp_path):
    cfg = CompareConfig(question="What is the capital of Norway?", options=["Oslo", "Helsinki", "Stockholm"],
                        models=[{"model": "bundled"}, {"model": "bundled", "temperature": 4.0, "label": "flattened"}],
                        max_new_tokens=4, device="cpu")
    report = compare(cfg, tmp_path, log=lambda m: None)
    (plain,), (flat,) = (r["answers"] for r in report["results"])
    assert [r["label"] for r in report["results"]] == ["bundled", "flattened"]
    assert sum(plain["probs"]) == pytest.approx(1.0) and plain["raw_probs"] == plain["probs"]
    np.testing.assert_allclose(flat["probs"], scale(np.array([flat["raw_probs"]]), 4.0)[0])
    assert max(flat["probs"]) < max(plain["probs"])  # a higher temperature is less sure
    assert flat["confidence"] == max(flat["probs"]) and flat["prediction"] == int(np.argmax(flat["probs"]))
    assert plain["generation"]["text"] and 0 < plain["generation"]["sequence_prob"] <= 1
    assert plain["generation"]["sequence_prob"] <= plain["generation"]["first_token_prob"]
    assert read_result(tmp_path) == json.loads((tmp_path / "compare.json").read_text())
    # The option probabilities come from the generation's first step: they must be letter scoring's.
    prompt = get_template(cfg.template).render(MCQRecord("q", cfg.question, tuple(cfg.options), 0, "u"), bundled.tokenizer)
    (score,) = score_letter(bundled.model, bundled.tokenizer, [prompt])
    np.testing.assert_allclose(plain["raw_probs"], score.probs, atol=1e-5)
    assert plain["option_mass"] == pytest.approx(float(score.vocab_probs.sum()), abs=1e-5)


@pytest.mark.model
@pytest.mark.slow
def test_a_list_of_questions_is_answered_as_each_alone(bundled, tmp_path):
    """Letter scoring batches a model's questions; each answer must equal asking that question alone."""
    questions = [{"question": "What is the capital of Norway?", "options": ["Oslo", "Helsinki", "Stockholm"], "answer": 0},
                 {"question": "Say hello."},
                 {"question": "Which is a fruit?", "options": ["apple", "stone", "car", "shoe"]}]
    models = [{"model": "bundled"}, {"model": "bundled", "temperature": 2.0, "label": "T=2"}]
    both = compare(CompareConfig(questions=questions, models=models, max_new_tokens=4, device="cpu"), tmp_path,
                   log=lambda m: None)
    for i, question in enumerate(questions):
        alone = compare(CompareConfig(questions=[question], models=models, max_new_tokens=4, device="cpu"),
                        tmp_path / str(i), log=lambda m: None)
        for together, single in zip(both["results"], alone["results"]):
            np.testing.assert_allclose(together["answers"][i].get("probs", []), single["answers"][0].get("probs", []),
                                       atol=1e-5)
            assert together["answers"][i]["generation"]["text"] == single["answers"][0]["generation"]["text"]
    table = rows(both)
    assert [(r["#"], r["model"]) for r in table] == [(1, "bundled"), (1, "T=2"), (2, "bundled"), (2, "T=2"),
                                                      (3, "bundled"), (3, "T=2")]
    assert "correct" in table[0] and "correct" not in table[4] and "prediction" not in table[2]


@pytest.mark.model
def test_free_text_only_generates(bundled, tmp_path):
    report = compare(CompareConfig(question="Say hello.", max_new_tokens=3, device="cpu"), tmp_path, log=lambda m: None)
    ((only,),) = (r["answers"] for r in report["results"])
    assert "probs" not in only and only["generation"]["tokens"] <= 3


@pytest.mark.unit
def test_the_question_box_reads_blocks_stars_and_pasted_letters():
    text = ("What is the capital of Norway?\nA) Oslo\n*B) Helsinki\n\n\n  Say hello.  \n \n"
            "Pick one\nA. keep A. as text\nC. since the letters are not A, B")
    assert parse_questions(text) == [
        {"question": "What is the capital of Norway?", "options": ["Oslo", "Helsinki"], "answer": 1},
        {"question": "Say hello.", "options": []},
        {"question": "Pick one", "options": ["A. keep A. as text", "C. since the letters are not A, B"]}]
    assert parse_questions(format_questions(parse_questions(text))) == parse_questions(text)
    with pytest.raises(ValueError, match="question 1: two options are marked"):
        parse_questions("Q\n*a\n*b")
    with pytest.raises(ValueError, match="Type a question"):
        parse_questions(" \n\n ")


@pytest.mark.unit
def test_a_compare_json_of_one_question_reads_as_a_list(tmp_path):
    old = {"question": "Capital?", "options": ["Oslo", "Bergen"], "results": [
        {"label": "m", "model": "bundled", "probs": [0.7, 0.3], "raw_probs": [0.7, 0.3], "prediction": 0,
         "temperature": None, "generation": {"text": "Oslo", "sequence_prob": 0.5, "first_token_prob": 0.6}}]}
    (tmp_path / "compare.json").write_text(json.dumps(old))
    report = read_result(tmp_path)
    assert report["questions"] == [{"question": "Capital?", "options": ["Oslo", "Bergen"]}]
    assert report["results"][0]["answers"][0]["confidence"] == 0.7
    assert rows(report)[0]["prediction"] == "A. Oslo"
    (tmp_path / "compare.json").write_text('{"questions": 3}')
    assert read_result(tmp_path) is None


@pytest.mark.unit
def test_the_answers_table_leads_with_the_answer_and_its_confidence():
    """At 1440 px the answer and probability columns were off-screen behind the question (issue 30)."""
    report = {"questions": [{"question": "Capital?", "options": ["Oslo", "Bergen"], "answer": 0}], "results": [
        {"label": "m", "model": "bundled", "temperature": None, "answers": [
            {"probs": [0.7, 0.3], "prediction": 0, "confidence": 0.7, "generation": {"text": "Oslo", "tokens": 2}}]}]}
    assert list(rows(report)[0]) == ["#", "model", "prediction", "confidence", "correct", "answer",
                                     "option probabilities", "answer prob.", "1st-token prob.", "T", "question"]


@pytest.mark.unit
def test_a_blank_generated_answer_says_why(tmp_path):
    """The untrained `scratch` model answers the Norway question with 48 newlines: the table said
    nothing at all; it now says what was generated and, for scratch, why."""
    report = {"questions": [{"question": "Capital?", "options": []}], "results": [
        {"label": label, "model": model, "temperature": None, "answers": [{"generation": {
            "text": "", "tokens": 48, "sequence_prob": 1e-112, "first_token_prob": 0.006}}]}
        for label, model in (("scratch", "scratch"), ("mine", "/runs/model"))]}
    scratch, mine = [row["answer"] for row in rows(report)]
    assert scratch.startswith("(blank: its 48 generated tokens are only whitespace or special tokens")
    assert "random weights" in scratch and "finetune-controlled" in scratch
    assert mine.startswith("(blank: its 48 generated tokens") and "random weights" not in mine


@pytest.mark.unit
def test_each_comparison_gets_its_own_folder(tmp_path):
    q = [{"question": "What is the capital of Norway? ../../etc"}]
    first, second = history_dir(tmp_path, q), history_dir(tmp_path, q)
    assert first != second and first.parent == second.parent == tmp_path / "comparisons"
    assert first.name.endswith("what-is-the-capital-of-norway-etc") and first.is_dir()


@pytest.mark.unit
@pytest.mark.parametrize("bad, message", [
    ({"question": " "}, "^question: must not be empty"), ({"question": "Q", "options": ["a"]}, "^options: give 2 to 26"),
    ({"question": "Q", "options": list("abcdefghijklmnopqrstuvwxyz0")}, "^options: has 27 entries; the limit is 26"),
    ({"question": "Q", "models": []}, "^models: name 1 to 4"),
    ({"question": "Q", "models": [{"model": "bundled"}] * 5}, "^models: has 5 entries; the limit is 4"),
    ({"question": "Q", "models": [{"model": "bundled", "temp": 2}]}, r"^models\[0\].temp: unknown key; did you mean temperature"),
    ({"question": "Q", "models": [{"adapter": "x"}]}, r"^models\[0\].model: must be set"),
    ({"question": "Q", "models": [{"model": "bundled", "temperature": -1}]}, r"^models\[0\].temperature: must be a temperature from 0.001 to 1000"),
    ({"question": "Q" * 20_001}, "^question: is 20,001 characters long; the limit is 20,000"),
    ({"questions": [{"question": "Q", "options": ["a", "b"], "answer": 2}]}, r"^questions\[0\].answer: is 2, but there are 2"),
    ({"questions": [{"question": "Q"}] * 101}, "^questions: has 101 entries; the limit is 100"),
    ({"questions": [{"question": "Q", "options": "ab"}]}, r"^questions\[0\].options: "),
    ({"question": "Other", "questions": [{"question": "Q"}]}, "^questions: give either")])
def test_bad_compare_configs_are_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        CompareConfig.from_dict(bad)
