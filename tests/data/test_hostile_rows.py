"""Rows a user's file may hold that once failed a whole job or reported a false figure: a lone surrogate
(``"\\ud800"``), oracle fields in data that is not the controlled task, a document too long to tokenise, and
a clm document's extra fields copied into each of its targets. Each is skipped and named ``file:line``, or
ignored, and the rest of the job stands."""
import json

import pytest

from lab.calibration.summary import oracle_metrics
from lab.core.errors import DataError
from lab.data import load
from lab.data.texts import MAX_DOCUMENT_CHARS, TextRecord
from lab.jobkit.kinds import parse_config
from lab.kinds.evaluate.run import evaluate
from lab.kinds.evaluate.tokens import _predictions_text, oracle_block

SURROGATE_LINE = '{"text": "Half a pair: \\ud800 here.", "entities": [[0, 4]]}'  # the JSON escape, as a file holds it
GOOD = {"text": "Paris is the capital of France.", "entities": [[0, 5], [24, 30]]}


def _lines(path, *lines: str):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def _run(tmp_path, model, **values):
    _, cfg = parse_config({"kind": "evaluate", "model": str(model), "bootstrap": 0, **values})
    out = tmp_path / "run"
    result = evaluate(cfg, out, log=lambda m: None)
    return result, [json.loads(line) for line in (out / "predictions.jsonl").read_text(encoding="utf-8").splitlines()]


# ---------------------------------------------------------------- a lone surrogate


@pytest.mark.unit
@pytest.mark.parametrize("task", ["clm", "facts"])
def test_a_lone_surrogate_in_a_text_row_is_skipped_and_named(tmp_path, task):
    data = _lines(tmp_path / "texts.jsonl", json.dumps(GOOD), SURROGATE_LINE)
    loaded = load("trex", "test", [str(data)], task=task)
    assert [r.text for r in loaded.records] == [GOOD["text"]]
    assert str(loaded.problems[0]).startswith(f"{data}:2: 'text' holds a lone surrogate ('\\ud800'")


@pytest.mark.unit
def test_a_lone_surrogate_in_sft_dpo_and_question_rows_is_skipped_and_named(tmp_path):
    sft = _lines(tmp_path / "sft.jsonl", json.dumps({"instruction": "Say hi.", "output": "Hi."}),
                 '{"instruction": "Say \\udfff.", "output": "no"}')
    loaded = load("instructions", "train", [f"train={sft}"], task="sft")
    assert len(loaded.records) == 1 and str(loaded.problems[0]).startswith(f"{sft}:2: 'instruction' holds a lone")
    dpo = _lines(tmp_path / "pairs.jsonl", json.dumps({"prompt": "Hi?", "chosen": "Hello.", "rejected": "Go."}),
                 '{"prompt": "Hi?", "chosen": "Hello.", "rejected": "\\ud800"}')
    loaded = load("ultrafeedback", files=[str(dpo)], task="preferences")
    pairs, problems = loaded.records, loaded.problems
    assert len(pairs) == 1 and str(problems[0]).startswith(f"{dpo}:2: 'rejected' holds a lone surrogate")
    mcq = _lines(tmp_path / "q.jsonl", json.dumps({"question": "Sky?", "choices": ["red", "blue"], "answer": 1}),
                 '{"question": "Sky?", "choices": ["red", "\\ud800"], "answer": 1}')
    loaded = load("custom", "test", [str(mcq)])
    assert len(loaded.records) == 1 and str(loaded.problems[0]).startswith(f"{mcq}:2: 'choices[1]' holds a lone")
    csv_file = tmp_path / "q.csv"  # choices as a JSON list in a cell: the escape decodes there
    csv_file.write_text('question,choices,answer\nSky?,"[""red"", ""blue""]",1\nSky?,"[""red"", ""\\ud800""]",1\n',
                        encoding="utf-8")
    loaded = load("custom", "test", [str(csv_file)])
    assert len(loaded.records) == 1 and "'choices': '[1]' holds a lone surrogate" in str(loaded.problems[0])


@pytest.mark.model
def test_a_clm_job_with_a_lone_surrogate_row_completes_and_names_it(tmp_path, tiny_model_dir):
    data = _lines(tmp_path / "texts.jsonl", json.dumps({"text": "The quick brown fox jumps over the lazy dog."}),
                  SURROGATE_LINE)
    result, rows = _run(tmp_path, tiny_model_dir, task="clm", dataset="text", data_files=[str(data)], min_context=2)
    assert rows and result["n_skipped_rows"] == 1 and {r["doc"] for r in rows} == {0}


# ---------------------------------------------------------------- oracle fields in user data


SHAPES = [[], ["a", "b"], [[0.5, 0.5]], [0.7], [0.2, 0.2], [0.5, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0], "0.5", None]


@pytest.mark.unit
@pytest.mark.parametrize("truth", SHAPES + [[0.5, 0.5]])
def test_a_text_row_carrying_oracle_fields_has_no_oracle(truth):
    record = TextRecord("r", "Paris is in France.", ((0, 5),), "trex", {"true_probs": truth, "answer": 0,
                                                                       "choices": ["a", "b"]})
    assert oracle_block([record], [{"doc": 0}], 10, "right") is None  # not the controlled task: no oracle


@pytest.mark.unit
def test_an_uploaded_question_carrying_oracle_fields_has_no_oracle():
    rows = [{"source": "custom", "choices": ["a", "b"], "answer": i % 2, "probs": [0.6, 0.4],
             "meta": {"true_probs": [0.9, 0.1]}} for i in range(6)]
    assert oracle_metrics(rows, 10, "right") is None
    for truth in SHAPES:  # malformed truths, even where the row names no dataset (a file edited by hand)
        ragged = [{**r, "source": "synthetic", "meta": {"true_probs": truth if i == 3 else [0.9, 0.1]}}
                  for i, r in enumerate(rows)]
        assert oracle_metrics(ragged, 10, "right") is None
        assert oracle_metrics([{k: v for k, v in r.items() if k != "source"} for r in ragged], 10, "right") is None
    valid = [{**r, "source": "synthetic"} for r in rows]
    assert oracle_metrics(valid, 10, "right")["accuracy"] == pytest.approx(0.5)


@pytest.mark.model
def test_a_facts_job_on_rows_with_oracle_fields_reports_no_oracle(tmp_path, tiny_model_dir):
    data = _lines(tmp_path / "facts.jsonl", *(json.dumps({**GOOD, "true_probs": truth, "answer": 0})
                                              for truth in SHAPES))
    result, rows = _run(tmp_path, tiny_model_dir, task="facts", dataset="trex", data_files=[str(data)], split="test")
    assert len(rows) == 2 * len(SHAPES) and "oracle" not in result and "ece_gap_to_oracle" not in result


# ---------------------------------------------------------------- sizes


@pytest.mark.unit
@pytest.mark.parametrize("suffix", [".txt", ".jsonl"])
def test_a_document_over_the_cap_is_skipped_before_tokenising_naming_file_line_and_cap(tmp_path, suffix):
    long = "word " * (MAX_DOCUMENT_CHARS // 5 + 1)
    path = tmp_path / f"long{suffix}"
    body = long if suffix == ".txt" else json.dumps({"text": long})
    path.write_text(f"{'A short one.' if suffix == '.txt' else json.dumps({'text': 'A short one.'})}\n\n{body}\n")
    loaded = load("text", "test", [str(path)], task="clm")
    assert [r.text for r in loaded.records] == ["A short one."]
    assert str(loaded.problems[0]).startswith(f"{path}:3: the document is {len(long):,} characters, over the "
                                              f"{MAX_DOCUMENT_CHARS:,}")


@pytest.mark.model
def test_a_clm_documents_extra_fields_are_stored_once_not_in_every_target(tmp_path, tiny_model_dir):
    extra = "x" * 50_000
    text = " ".join(f"word{i}" for i in range(120))
    data = _lines(tmp_path / "texts.jsonl", json.dumps({"text": text, "notes": extra}))
    _, rows = _run(tmp_path, tiny_model_dir, task="clm", dataset="text", data_files=[str(data)], positions=40)
    assert len(rows) == 40 and [r.get("meta") for r in rows].count({"notes": extra}) == 1 and "meta" in rows[0]
    assert (tmp_path / "run" / "predictions.jsonl").stat().st_size < 40 * 4_000 + len(extra)


@pytest.mark.unit
def test_predictions_past_the_cap_fail_with_a_message_saying_what_to_do():
    rows = [{"doc": 0, "text": "y" * 1000} for _ in range(50)]
    assert _predictions_text(rows, cap=10**6).count("\n") == 50
    with pytest.raises(DataError, match=r"predictions.jsonl would pass 0 MiB, the most one token run writes, at its "
                                        r"row 20 of 50 .*score fewer documents \(limit\)"):
        _predictions_text(rows, cap=20_000)
