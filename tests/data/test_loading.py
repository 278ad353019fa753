"""lab.data: the real files in ../shared/data, custom files, hub converters (offline), splits.

Expected values come from SOURCES.md and from reading the raw files here with plain json/csv,
independently of the lab's readers.
"""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import datasets
import pytest

from lab.core.registry import UnknownNameError
from lab.data import DATASETS, DataError, MCQRecord, carve, dataset_names, hub_copy, load

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def questions(n: int) -> list[dict]:
    return [{"question": f"q{i}?", "choices": ["x", "y"], "answer": i % 2, "id": f"q{i}"} for i in range(n)]


def ids(records: list[MCQRecord]) -> list[str]:
    return [r.id for r in records]


# ---------------------------------------------------------------- real files


@pytest.mark.parametrize("name, rel, split, n", [
    ("csqa", "commonsenseqa/train.jsonl", "train", 9741),
    ("csqa", "commonsenseqa/dev.jsonl", "dev", 1221),
    ("arc_challenge", "arc_challenge/dev.jsonl", "dev", 299),
    ("arc_challenge", "arc_challenge/test.jsonl", "test", 1172),
    ("obqa", "openbookqa/train.jsonl", "train", 4957),
    ("obqa", "openbookqa/dev.jsonl", "validation", 500),
    ("obqa", "openbookqa/test.jsonl", "test", 500),
    ("boolq", "boolq/dev.jsonl", "dev", 3270),
    ("mmlu", "mmlu/dev", "dev", 285),
    ("mmlu", "mmlu/val", "validation", 1531),
    ("mmlu", "mmlu/test", "test", 14042),
    ("medmcqa", "medmcqa/dev.jsonl", "dev", 4183),
])
def test_real_files_load_every_row(shared_data, name, rel, split, n):
    result = load(name, split, [str(shared_data / rel)])
    assert len(result.records) == n
    assert result.problems == []
    assert f"({n} rows, 0 skipped)" in result.source
    assert {r.source for r in result.records} == {name}
    assert len(set(ids(result.records))) == n


@pytest.mark.parametrize("name, rel", [("arc_challenge", "arc_challenge/test.jsonl"),
                                       ("arc_challenge", "arc_challenge/dev.jsonl"),
                                       ("csqa", "commonsenseqa/dev.jsonl"), ("obqa", "openbookqa/test.jsonl")])
def test_ai2_answer_is_the_choice_labelled_answerkey(shared_data, name, rel):
    raw = [json.loads(line) for line in (shared_data / rel).read_text(encoding="utf-8").splitlines()]
    records = load(name, "test", [str(shared_data / rel)]).records
    for row, record in zip(raw, records, strict=True):
        by_label = {c["label"]: c["text"] for c in row["question"]["choices"]}
        assert record.choices[record.answer] == by_label[row["answerKey"]]
        assert record.labels == tuple(c["label"] for c in row["question"]["choices"])


def test_arc_challenge_test_known_row_numeric_labels_and_choice_counts(shared_data):
    path = shared_data / "arc_challenge/test.jsonl"
    first = json.loads(path.read_text(encoding="utf-8").splitlines()[0])
    records = load("arc_challenge", "test", [str(path)]).records
    assert first["answerKey"] == "C" and records[0].id == first["id"]
    assert records[0].answer == 2
    assert records[0].choices[2] == "Planetary days will become shorter."
    numeric = [r for r in records if r.labels[0] == "1"]
    assert len(numeric) == 22  # SOURCES.md
    assert all(r.labels == tuple(str(i) for i in range(1, len(r.choices) + 1)) for r in numeric)
    assert {len(r.choices) for r in records} == {3, 4, 5}


def test_csqa_keeps_labels_and_question_concept(shared_data):
    records = load("csqa", "train", [str(shared_data / "commonsenseqa/train.jsonl")]).records
    assert {r.labels for r in records} == {("A", "B", "C", "D", "E")}
    assert records[0].meta["question_concept"] == "punishing"
    assert records[0].choices[records[0].answer] == "ignore"  # answerKey "A"


def test_csqa_unlabelled_test_file_is_refused(shared_data):
    with pytest.raises(DataError, match="unlabelled") as err:
        load("csqa", "test", [str(shared_data / "commonsenseqa/test_no_answers.jsonl")])
    assert "no answer" in str(err.value) and "test_no_answers.jsonl:1" in str(err.value)
    assert len(err.value.problems) == 1140


def test_boolq_yes_no_passage_title(shared_data):
    records = load("boolq", "dev", [str(shared_data / "boolq/dev.jsonl")]).records
    assert round(sum(r.answer for r in records) / len(records), 3) == 0.622
    assert {r.choices for r in records} == {("No", "Yes")}
    assert records[0].answer == 0 and records[0].meta["title"] == "Ethanol fuel"  # "answer": false
    assert all(r.passage for r in records)


def test_mmlu_subjects_from_file_names_and_subject_filter(shared_data):
    records = load("mmlu", "test", [str(shared_data / "mmlu/test")]).records
    assert len({r.meta["subject"] for r in records}) == 57
    algebra = load("mmlu", "test", [str(shared_data / "mmlu/test")], subject="abstract_algebra").records
    with (shared_data / "mmlu/test/abstract_algebra_test.csv").open(newline="", encoding="utf-8") as f:
        raw = list(csv.reader(f))
    assert len(algebra) == len(raw) == 100
    assert {r.meta["subject"] for r in algebra} == {"abstract_algebra"}
    assert raw[0][5] == "B" and algebra[0].answer == 1 and algebra[0].choices[1] == raw[0][2]
    with pytest.raises(DataError, match="Subjects found: .*anatomy"):
        load("mmlu", "test", [str(shared_data / "mmlu/test")], subject="astrology")


def test_medmcqa_cop_is_one_based_in_files(shared_data):
    records = load("medmcqa", "dev", [str(shared_data / "medmcqa/dev.jsonl")]).records
    assert Counter(r.answer for r in records) == {0: 1348, 1: 1085, 2: 925, 3: 825}
    assert records[0].answer == 0 and records[0].choices[0].startswith("Impulse through")  # "cop": 1
    assert records[0].meta["subject_name"] == "Physiology" and records[0].meta["choice_type"] == "multi"


def test_arc_easy_reads_the_arc_format(tmp_path):
    path = write_jsonl(tmp_path / "ARC-Easy-Test.jsonl", [
        {"id": "e1", "question": {"stem": "Which?", "choices": [
            {"text": "one", "label": "1"}, {"text": "two", "label": "2"}, {"text": "three", "label": "3"}]},
         "answerKey": "3"}])
    [record] = load("arc_easy", "test", [str(path)]).records
    assert (record.source, record.answer, record.labels) == ("arc_easy", 2, ("1", "2", "3"))


# ---------------------------------------------------------------- custom files


def test_custom_jsonl_answer_forms(tmp_path):
    path = write_jsonl(tmp_path / "mine.jsonl", [
        {"question": "2+2?", "choices": ["3", "4", "5"], "answer": "B"},
        {"question": "Capital?", "choices": ["Rome", "Paris"], "answer": 1, "id": 7, "passage": "P."},
        {"Question": "Grass?", "choices": ["red", "green"], "Answer": " green ", "context": "C.",
         "topic": "t"},
        {"question": "Which?", "choices": ["1", "2", "3"], "answer": "2"},  # a choice text beats an index
        {"question": "Last?", "A": "x", "B": "y", "C": "z", "answer": "c"},
    ])
    records = load("custom", "test", [str(path)]).records
    assert [r.answer for r in records] == [1, 1, 1, 1, 2]
    assert ids(records) == ["mine-1", "7", "mine-3", "mine-4", "mine-5"]
    assert (records[1].passage, records[2].passage, records[2].meta) == ("P.", "C.", {"topic": "t"})
    assert records[4].choices == ("x", "y", "z")


def test_custom_csv_option_columns_and_digit_answers(tmp_path):
    path = tmp_path / "quiz.csv"
    path.write_text('Question,A,B,C,D,E,Answer\n'
                    'five?,a,b,c,d,e,e\n'
                    'four?,a,b,c,d,,3\n'
                    '"two\nlines?",red,Blue,,,,Blue\n'
                    'numbers?,0,1,2,,,0\n', encoding="utf-8")
    records = load("custom", "test", [str(path)]).records
    assert [r.answer for r in records] == [4, 3, 1, 0]
    assert [len(r.choices) for r in records] == [5, 4, 2, 3]
    assert ids(records) == ["quiz-2", "quiz-3", "quiz-4", "quiz-6"]  # physical lines; row 3 spans 4-5


def test_custom_csv_choices_as_json_list(tmp_path):
    path = tmp_path / "q.csv"
    path.write_text('id,question,choices,answer\nk1,Pick,"[""a"", ""b"", ""c""]",b\n', encoding="utf-8")
    [record] = load("custom", "test", [str(path)]).records
    assert (record.id, record.choices, record.answer) == ("k1", ("a", "b", "c"), 1)


BAD_JSONL = [
    '{"question": "ok?", "choices": ["a", "b"], "answer": "A"}',
    '{"question": "q", "choices": ["a", "b"], "answer": ""}',
    '{"question": "q", "choices": ["a", "b"], "answer": "purple"}',
    '{"question": "q", "choices": [], "answer": "A"}',
    '{"question": "q", "choices": ["a", "b"], "answer": "A"',
    '',
    '{"question": "also ok?", "choices": ["a", "b"], "answer": 0}',
    '{"question": " ", "choices": ["a", "b"], "answer": "A"}',
    '{"question": "q", "choices": {"a": 1}, "answer": "A"}',
    '{"question": "q", "choices": ["a", "b"], "answer": "C"}',
]


def test_custom_bad_rows_skipped_with_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(BAD_JSONL) + "\n", encoding="utf-8")
    result = load("custom", "test", [str(path)])
    assert ids(result.records) == ["bad-1", "bad-7"]
    assert [(p.file, p.line) for p in result.problems] == [(str(path), n) for n in (2, 3, 4, 5, 8, 9, 10)]
    reasons = [p.reason for p in result.problems]
    for reason, expected in zip(reasons, ["no answer", "not a letter", "no choices", "invalid JSON",
                                          "empty 'question'", "should be a list", "not among the 2 choices"]):
        assert expected in reason
    assert "(2 rows, 7 skipped)" in result.source


def test_custom_bad_rows_error_mode(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(BAD_JSONL) + "\n", encoding="utf-8")
    with pytest.raises(DataError) as err:
        load("custom", "test", [str(path)], on_bad_rows="error")
    message = str(err.value)
    assert message.startswith("7 bad rows") and "on_bad_rows='skip'" in message
    assert f"{path}:2: no answer" in message and f"{path}:8:" in message
    assert f"{path}:9:" not in message and "and 2 more" in message
    assert len(err.value.problems) == 7


def test_custom_csv_wrong_column_count_line_after_multiline_cell(tmp_path):
    path = tmp_path / "c.csv"
    path.write_text('question,a,b,answer\n"multi\nline",x,y,A\nshort,x,A\nfine,x,y,b\n', encoding="utf-8")
    result = load("custom", "test", [str(path)])
    assert ids(result.records) == ["c-2", "c-5"]
    [problem] = result.problems
    assert (problem.line, problem.reason) == (4, "3 columns, expected 4 as in the header")


def test_custom_json_list_rows_keep_their_lines(tmp_path):
    path = tmp_path / "list.json"
    path.write_text('[\n  {"question": "a?", "choices": ["x", "y"], "answer": 1},\n'
                    '  {\n    "question": "b?",\n    "choices": ["x", "y"],\n    "answer": 5\n  }\n]\n',
                    encoding="utf-8")
    result = load("custom", "test", [str(path)])
    assert ids(result.records) == ["list-2"]
    assert [(p.line, p.reason) for p in result.problems] == [(3, "answer index 5 is outside 0..1 (answers as "
                                                                 "numbers are 0-based)")]


def test_custom_missing_column_names_missing_found_and_expected(tmp_path):
    path = tmp_path / "m.csv"
    path.write_text("question,options,solution\nq,x,y\n", encoding="utf-8")
    with pytest.raises(DataError) as err:
        load("custom", "test", [str(path)])
    message = str(err.value)
    assert "missing answer, choices (or option columns A, B, ...)" in message
    assert "found 'question', 'options', 'solution'" in message and "Expected: question;" in message
    jsonl = write_jsonl(tmp_path / "m.jsonl", [{"question": "q", "choices": ["a"]}])
    with pytest.raises(DataError, match="No usable rows.*missing answer; found 'question', 'choices'"):
        load("custom", "test", [str(jsonl)])


def test_user_errors_are_data_errors(tmp_path):
    with pytest.raises(DataError, match="--data-files"):
        load("custom", "test")
    with pytest.raises(DataError, match="nope.jsonl"):
        load("custom", "test", [str(tmp_path / "nope.jsonl")])
    (tmp_path / "q.txt").write_text("question,choices,answer\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"\.jsonl, \.json or \.csv"):
        load("custom", "test", [str(tmp_path / "q.txt")])
    (tmp_path / "latin1.jsonl").write_bytes('{"question": "caf\xe9"}\n'.encode("latin-1"))
    with pytest.raises(DataError, match="not UTF-8"):
        load("custom", "test", [str(tmp_path / "latin1.jsonl")])
    (tmp_path / "empty.jsonl").write_text("\n", encoding="utf-8")
    with pytest.raises(DataError, match="No rows"):
        load("custom", "test", [str(tmp_path / "empty.jsonl")])
    with pytest.raises(DataError, match="has no subjects"):
        load("boolq", "dev", [str(tmp_path / "empty.jsonl")], subject="law")
    with pytest.raises(DataError, match="on_bad_rows"):
        load("custom", "test", [str(tmp_path / "empty.jsonl")], on_bad_rows="ignore")  # type: ignore[arg-type]


def test_unknown_dataset_lists_valid_names():
    with pytest.raises(UnknownNameError, match="Did you mean 'csqa'.*Valid names: alpaca, arc_challenge, arc_easy"):
        load("cqsa")


def test_dataset_names():
    assert dataset_names("mcq") == ["arc_challenge", "arc_easy", "boolq", "csqa", "custom", "medmcqa", "mmlu",
                               "obqa", "synthetic"]


# ---------------------------------------------------------------- paths


def test_directories_globs_and_paths_with_equals(tmp_path, monkeypatch):
    folder = tmp_path / "d"
    folder.mkdir()
    write_jsonl(folder / "b.jsonl", [{**questions(1)[0], "id": "b"}])
    write_jsonl(folder / "a.jsonl", [{**questions(1)[0], "id": "a"}])
    (folder / "notes.txt").write_text("not data", encoding="utf-8")
    assert ids(load("custom", "test", [str(folder)]).records) == ["a", "b"]
    assert ids(load("custom", "test", [str(folder / "*.jsonl")]).records) == ["a", "b"]
    with pytest.raises(DataError, match="No files match"):
        load("custom", "test", [str(folder / "*.csv")])
    monkeypatch.chdir(folder)  # a relative path that looks like split=path but exists is a path
    (folder / "test=x.jsonl").write_text((folder / "a.jsonl").read_text(), encoding="utf-8")
    assert ids(load("custom", "train", ["test=x.jsonl"]).records) == ["a"]


# ---------------------------------------------------------------- hub (offline, monkeypatched)


class FakeHub:
    """Stands in for datasets.load_dataset: serves `rows` in the hub schema, records each call."""

    def __init__(self) -> None:
        self.rows: list[dict] = []
        self.calls: list[tuple] = []

    def __call__(self, path, name=None, split=None, **kwargs):
        self.calls.append((path, name, split))
        return datasets.Dataset.from_list(self.rows)


@pytest.fixture
def online(monkeypatch) -> None:
    monkeypatch.setattr(hub_copy, "hub_reachable", lambda: True)


@pytest.fixture
def hub(monkeypatch, online) -> FakeHub:
    fake = FakeHub()
    monkeypatch.setattr(datasets, "load_dataset", fake)
    return fake


def test_hub_csqa(hub):
    hub.rows = [{"id": "c1", "question": "Where?", "question_concept": "place", "answerKey": "D",
                 "choices": {"label": list("ABCDE"), "text": ["a", "b", "c", "d", "e"]}}]
    [record] = load("csqa", "dev").records
    assert (record.question, record.answer, record.meta) == ("Where?", 3, {"question_concept": "place"})
    assert hub.calls == [("tau/commonsense_qa", None, "validation")]
    hub.rows[0]["answerKey"] = ""  # the hub's test split
    with pytest.raises(DataError, match="unlabelled"):
        load("csqa", "test")


def test_hub_obqa_and_arc(hub):
    choices = {"text": ["a", "b", "c", "d"], "label": ["A", "B", "C", "D"]}
    hub.rows = [{"id": "o1", "question_stem": "Why?", "choices": choices, "answerKey": "B"}]
    [record] = load("obqa", "train").records
    assert (record.id, record.question, record.answer) == ("o1", "Why?", 1)
    assert hub.calls[-1] == ("allenai/openbookqa", "main", "train")
    hub.rows = [{"id": "a1", "question": "Q?", "choices": {"text": ["x", "y", "z"], "label": ["1", "2", "3"]},
                 "answerKey": "3"},
                {"id": "a2", "question": "Q?", "choices": {"text": ["x", "y", "z"], "label": ["1", "2", "3"]},
                 "answerKey": "4"}]
    for name, config in (("arc_challenge", "ARC-Challenge"), ("arc_easy", "ARC-Easy")):
        result = load(name, "test")
        assert [(r.answer, r.labels, r.source) for r in result.records] == [(2, ("1", "2", "3"), name)]
        assert [(p.file, p.line) for p in result.problems] == [("test", 1)]
        assert "'4' is not one of the choice labels 1, 2, 3" in result.problems[0].reason
        assert hub.calls[-1] == ("allenai/ai2_arc", config, "test")


def test_hub_boolq(hub):
    hub.rows = [{"question": "is it", "answer": True, "passage": "P"},
                {"question": "is it not", "answer": False, "passage": "P"}]
    records = load("boolq", "validation").records
    assert [(r.answer, r.choices, r.passage) for r in records] == [(1, ("No", "Yes"), "P"),
                                                                   (0, ("No", "Yes"), "P")]
    assert hub.calls == [("google/boolq", None, "validation")]
    with pytest.raises(DataError, match="no 'test' split on the hub .*it has: train, validation"):
        load("boolq", "test")
    assert len(hub.calls) == 1


def test_hub_mmlu_configs_and_splits(hub):
    hub.rows = [{"question": "Q?", "subject": "anatomy", "choices": ["a", "b", "c", "d"], "answer": 2}]
    [record] = load("mmlu", "test").records
    assert (record.answer, record.labels, record.meta) == (2, ("A", "B", "C", "D"), {"subject": "anatomy"})
    load("mmlu", "dev", subject="anatomy")
    load("mmlu", "validation")
    load("mmlu", "train")
    assert hub.calls == [("cais/mmlu", "all", "test"), ("cais/mmlu", "anatomy", "dev"),
                         ("cais/mmlu", "all", "validation"), ("cais/mmlu", "all", "auxiliary_train")]


def test_hub_medmcqa_cop_is_zero_based(hub):
    base = {"question": "Q?", "opa": "a", "opb": "b", "opc": "c", "opd": "d", "choice_type": "single",
            "exp": None, "subject_name": "Anatomy", "topic_name": None}
    hub.rows = [{**base, "id": "m0", "cop": 0}, {**base, "id": "m3", "cop": 3},
                {**base, "id": "mx", "cop": -1}]
    result = load("medmcqa", "dev")
    assert [(r.id, r.answer) for r in result.records] == [("m0", 0), ("m3", 3)]
    assert result.records[0].meta["subject_name"] == "Anatomy"
    [problem] = result.problems
    assert (problem.file, problem.line) == ("validation", 2) and problem.reason.startswith("no answer")
    assert hub.calls == [("openlifescienceai/medmcqa", None, "validation")]


def test_hub_failure_is_one_clear_error(monkeypatch, online):
    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'allenai/ai2_arc' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(DataError) as err:
        load("arc_challenge", "test")
    message = str(err.value)
    assert message.startswith("Could not load arc_challenge from the Hugging Face hub (allenai/ai2_arc")
    assert "Couldn't reach" in message and "--data-files" in message
    assert DATASETS.get("arc_challenge").local_format in message


def test_unreachable_hub_fails_at_once_without_calling_load_dataset(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(hub_copy, "hub_reachable", lambda: False)
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: pytest.fail("load_dataset was called"))
    with pytest.raises(DataError, match="cannot be reached to load boolq.*--data-files.*HF_HUB_OFFLINE=1"):
        load("boolq", "validation")


# ---------------------------------------------------------------- splits


def fake_records(n: int) -> list[MCQRecord]:
    return [MCQRecord(id=f"r{i}", question="q", choices=("a", "b"), answer=0, source="t") for i in range(n)]


def test_carve_is_deterministic_disjoint_and_covering():
    records = fake_records(100)
    parts = carve(records, (0.8, 0.1, 0.1), seed=0)
    assert {k: len(v) for k, v in parts.items()} == {"train": 80, "validation": 10, "test": 10}
    assert parts == carve(records, (0.8, 0.1, 0.1), seed=0)
    assert parts != carve(records, (0.8, 0.1, 0.1), seed=1)
    assert sorted(sum((ids(v) for v in parts.values()), []), key=lambda s: int(s[1:])) == ids(records)
    for part in parts.values():  # each part keeps the original order
        assert ids(part) == sorted(ids(part), key=lambda s: int(s[1:]))
    assert parts["validation"] != records[80:90]  # shuffled, not cut from the end
    with pytest.raises(DataError, match="sum to 1"):
        carve(records, (0.8, 0.1, 0.2))


CARVE_IN_A_FRESH_PROCESS = """
from lab.data import MCQRecord, carve
records = [MCQRecord(id=f"r{i}", question="q", choices=("a", "b"), answer=0, source="t") for i in range(50)]
print(" ".join(r.id for r in carve(records, (0.6, 0.2, 0.2), seed=3)["validation"]))
"""


def test_carve_does_not_depend_on_the_hash_seed():
    outputs = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        run = subprocess.run([sys.executable, "-c", CARVE_IN_A_FRESH_PROCESS], cwd=REPO, env=env,
                             capture_output=True, text=True, check=True)
        outputs.append(run.stdout.split())
    assert outputs[0] == outputs[1] == ids(carve(fake_records(50), (0.6, 0.2, 0.2), seed=3)["validation"])


def test_source_part_carves_plain_files(tmp_path):
    path = write_jsonl(tmp_path / "dev.jsonl", questions(40))
    everything = load("custom", "dev", [str(path)]).records
    expected = carve(everything, (0.5, 0.25, 0.25), seed=7)
    kwargs = {"fractions": (0.5, 0.25, 0.25), "seed": 7}
    validation = load("custom", "dev:validation", [str(path)], **kwargs)
    test = load("custom", "dev:test", [str(path)], **kwargs)
    assert validation.records == expected["validation"] and len(validation.records) == 10
    assert test.records == expected["test"] and not set(ids(validation.records)) & set(ids(test.records))
    assert "the validation part of a seed-7 0.5/0.25/0.25 carve: 10 rows" in validation.source
    limited = load("custom", "dev:validation", [str(path)], **kwargs, limit=3)
    assert limited.records == expected["validation"][:3]


def test_named_data_files_pick_the_split(tmp_path):
    train = write_jsonl(tmp_path / "a.jsonl", questions(3))
    valid = write_jsonl(tmp_path / "b.jsonl", [{**q, "id": "v" + q["id"]} for q in questions(2)])
    files = [f"train={train}", f"validation={valid}"]
    assert ids(load("custom", "dev", files).records) == ["vq0", "vq1"]
    assert ids(load("custom", "train", files).records) == ["q0", "q1", "q2"]
    assert ids(load("custom", "train:test", files, fractions=(0, 0, 1)).records) == ["q0", "q1", "q2"]
    with pytest.raises(DataError, match="No data files for split 'test': the files given are for train, "
                                        "validation"):
        load("custom", "test", files)
    with pytest.raises(DataError, match="Unknown split 'tset' in data file entry.*train, validation, test"):
        load("custom", "test", [f"tset={train}"])
    with pytest.raises(DataError, match="Unknown split 'bogus'.*dev:validation"):
        load("custom", "bogus", [str(train)])


def test_mmlu_keeps_dev_and_validation_apart(shared_data):
    files = [f"dev={shared_data / 'mmlu/dev'}", f"validation={shared_data / 'mmlu/val'}"]
    assert len(load("mmlu", "dev", files).records) == 285
    assert len(load("mmlu", "val", files).records) == 1531


def test_limit_takes_the_first_records(tmp_path):
    path = write_jsonl(tmp_path / "x.jsonl", questions(10))
    result = load("custom", "test", [str(path)], limit=3)
    assert ids(result.records) == ["q0", "q1", "q2"] and result.source.endswith(", first 3")
    assert len(load("custom", "test", [str(path)], limit=50).records) == 10
    with pytest.raises(DataError, match="positive integer"):
        load("custom", "test", [str(path)], limit=0)


# ---------------------------------------------------------------- rows every dataset refuses


def test_a_one_choice_question_is_a_bad_row_in_jsonl_and_csv(tmp_path):
    jsonl = write_jsonl(tmp_path / "one.jsonl", [{"id": "one", "question": "q?", "choices": ["only"], "answer": 0},
                                                  {"id": "two", "question": "q?", "choices": ["x", "y"], "answer": 1}])
    csv_path = tmp_path / "one.csv"
    csv_path.write_text("id,question,A,B,answer\none,q?,only,,A\ntwo,q?,x,y,B\n", encoding="utf-8")
    for path in (jsonl, csv_path):
        result = load("custom", "test", [str(path)])
        assert ids(result.records) == ["two"]
        [problem] = result.problems
        assert (problem.file, problem.line) == (str(path), 1 if path is jsonl else 2)
        assert problem.reason == "only 1 choice: a question needs at least 2 options"
        with pytest.raises(DataError, match="only 1 choice"):
            load("custom", "test", [str(path)], on_bad_rows="error")


def test_a_one_choice_hub_row_is_a_bad_row(hub):
    hub.rows = [{"question": "Q?", "choices": ["a"], "answer": 0, "subject": "x"},
                {"question": "Q?", "choices": ["a", "b"], "answer": 1, "subject": "x"}]
    result = load("mmlu", "test")
    assert ids(result.records) == ["test-1"]
    assert [(p.file, p.line, p.reason) for p in result.problems] == [
        ("test", 0, "only 1 choice: a question needs at least 2 options")]


def test_records_know_where_they_were_read(tmp_path):
    path = write_jsonl(tmp_path / "x.jsonl", questions(2))
    assert [r.where for r in load("custom", "test", [str(path)]).records] == [f"{path}:1", f"{path}:2"]


def test_duplicate_ids_are_bad_rows_with_both_locations(tmp_path):
    first = write_jsonl(tmp_path / "a.jsonl", questions(3))
    second = write_jsonl(tmp_path / "b.jsonl", [{**questions(2)[1], "question": "other?"}])
    first.write_text(first.read_text() + json.dumps(questions(1)[0]) + "\n")  # q0 again, at a.jsonl:4
    result = load("custom", "test", [str(first), str(second)])
    assert ids(result.records) == ["q0", "q1", "q2"]  # the first of each id is kept
    assert [(p.file, p.line) for p in result.problems] == [(str(first), 4), (str(second), 1)]
    assert result.problems[0].reason.startswith(f"duplicate id 'q0': first seen at {first}:1")
    assert result.problems[1].reason.startswith(f"duplicate id 'q1': first seen at {first}:2")
    assert "(3 rows, 2 skipped)" in result.source
    with pytest.raises(DataError) as err:
        load("custom", "test", [str(first), str(second)], on_bad_rows="error")
    assert str(err.value).startswith("2 bad rows")
    assert f"{first}:4: duplicate id 'q0': first seen at {first}:1" in str(err.value)


def test_default_ids_of_two_files_with_one_name_collide_and_say_why(tmp_path):
    rows = [{k: v for k, v in q.items() if k != "id"} for q in questions(2)]
    (tmp_path / "x").mkdir(), (tmp_path / "y").mkdir()
    a, b = write_jsonl(tmp_path / "x" / "test.jsonl", rows), write_jsonl(tmp_path / "y" / "test.jsonl", rows[:1])
    [problem] = load("custom", "test", [str(a), str(b)]).problems
    assert problem.reason.startswith(f"duplicate id 'test-1': first seen at {a}:1")
    assert "two files share a name" in problem.reason


DEEP = "[" * 100_000 + "]" * 100_000


def test_deeply_nested_jsonl_line_is_a_bad_row(tmp_path):
    path = tmp_path / "deep.jsonl"
    # The row is level 1: 99 lists inside it make 100 levels, the most a row may have (MAX_DEPTH).
    shallow_enough = {**questions(1)[0], "id": "meta", "extra": json.loads("[" * 99 + "]" * 99)}
    too_deep_meta = {**questions(1)[0], "id": "deep-meta", "extra": json.loads("[" * 100 + "]" * 100)}
    path.write_text("\n".join([json.dumps(questions(1)[0]), DEEP, json.dumps(shallow_enough),
                               json.dumps(too_deep_meta)]) + "\n", encoding="utf-8")
    result = load("custom", "test", [str(path)])
    assert ids(result.records) == ["q0", "meta"]
    assert [(p.line, p.reason.split(" (")[0]) for p in result.problems] == [(2, "nested too deeply"),
                                                                            (4, "nested too deeply")]
    csv_path = tmp_path / "deep.csv"
    deep_cell = "[" * 10_000 + "]" * 10_000  # a CSV cell holds at most 131,072 characters
    csv_path.write_text(f'question,choices,answer\nq?,"{deep_cell}",0\nq?,"[""x"", ""y""]",0\n', encoding="utf-8")
    result = load("custom", "test", [str(csv_path)])
    assert len(result.records) == 1 and result.problems[0].reason.startswith("'choices' is nested too deeply")


def test_a_csv_cell_past_the_reader_limit_is_named_as_such(tmp_path):
    path = tmp_path / "long.csv"
    path.write_text(f"question,A,B,answer\n{'x' * 200_000},a,b,A\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"long\.csv:2: a cell is longer than 131,072 characters"):
        load("custom", "test", [str(path)])


def test_deeply_nested_json_file_is_a_data_error(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text(DEEP, encoding="utf-8")
    with pytest.raises(DataError, match=r"deep\.json:1: the list element that starts here is nested too deeply"):
        load("custom", "test", [str(path)])


def test_preference_files_that_are_not_utf8_are_data_errors(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_bytes('{"prompt": "caf\xe9", "chosen": "a", "rejected": "b"}\n'.encode("latin-1"))
    with pytest.raises(DataError, match="pairs.jsonl is not UTF-8 text"):
        load("ultrafeedback", files=[str(path)], task="preferences")
