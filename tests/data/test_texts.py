"""The texts of the token tasks (lab/data/texts.py): clm and facts files, every bad input with its
file:line, the bundled samples (Shakespeare, T-REx, the controlled task's statements), the refusals
of a dataset for a task it does not feed, and the text templates (the paper's Table 1)."""
import json
from pathlib import Path

import pytest

from lab.core.reads import PathNotAllowed, restricted
from lab.data import DATASETS, DataError, Load, MCQRecord, TextRecord, dataset_names, load, samples
from lab.data.synthetic import statement
from lab.data.templates import Prompt, get_template, template_names
from tests.helpers import script_module

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def _jsonl(path: Path, *rows) -> Path:
    return _write(path, "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))


# ---------------------------------------------------------------- formats


def test_plain_text_documents_are_split_on_blank_lines_and_named_by_their_first_line(tmp_path):
    path = _write(tmp_path / "book.txt", "\nFirst line\nsecond line\n\n\n   \nThird, alone.\n \n\nLast\nbit")
    loaded = load("text", files=[str(path)], task="clm")
    assert isinstance(loaded, Load) and loaded.problems == []
    assert [(r.id, r.text, r.where) for r in loaded.records] == [
        ("book-2", "First line\nsecond line", f"{path}:2"), ("book-7", "Third, alone.", f"{path}:7"),
        ("book-10", "Last\nbit", f"{path}:10")]
    assert all(r.entities == () and r.source == "text" and r.origin[0] == str(path) for r in loaded.records)
    assert loaded.source == f"text clm test from {path} (3 documents, 0 skipped)"


def test_windows_line_ends_and_a_byte_order_mark_are_not_part_of_the_text(tmp_path):
    path = tmp_path / "dos.txt"
    path.write_bytes(b"\xef\xbb\xbfOne\r\ntwo\r\n\r\nThree\r\n")
    assert [r.text for r in load("text", files=[str(path)], task="clm").records] == ["One\ntwo", "Three"]


def test_json_lines_with_a_text_field_keep_their_ids_and_other_fields(tmp_path):
    path = _jsonl(tmp_path / "docs.jsonl", {"id": "a", "text": "Alpha beta.", "url": "x"}, "",
                  {"text": "Gamma delta.", "entities": [[0, 5]]})
    records = load("text", files=[str(path)], task="clm").records
    assert [(r.id, r.text, r.meta, r.entities, r.origin) for r in records] == [
        ("a", "Alpha beta.", {"url": "x"}, (), (str(path), 1)), ("docs-3", "Gamma delta.", {}, (), (str(path), 3))]
    as_list = _write(tmp_path / "docs.json", json.dumps([{"text": "One."}, {"text": "Two."}], indent=1))
    assert [r.text for r in load("text", files=[str(as_list)], task="clm").records] == ["One.", "Two."]


def test_facts_rows_carry_their_entity_spans_sorted(tmp_path):
    text = "Paris is the capital of France."
    path = _jsonl(tmp_path / "facts.jsonl", {"id": "p", "text": text, "entities": [[24, 30], [0, 5]], "title": "P"})
    [record] = load("trex", files=[str(path)], task="facts").records
    assert record.entities == ((0, 5), (24, 30)) and [text[s:e] for s, e in record.entities] == ["Paris", "France"]
    assert record.meta == {"title": "P"} and record.source == "trex" and record.id == "p"


def test_clm_on_a_facts_file_ignores_the_entities_even_bad_ones(tmp_path):
    path = _jsonl(tmp_path / "facts.jsonl", {"text": "Some text here.", "entities": [[9, 3]]},
                  {"text": "More text.", "entities": [[0, 4]]})
    loaded = load("trex", files=[str(path)], task="clm")
    assert loaded.problems == [] and [r.entities for r in loaded.records] == [(), ()]
    assert all("entities" not in r.meta for r in loaded.records)
    with pytest.raises(DataError, match=r"facts\.jsonl:1: entities\[0\] \[9, 3\] is reversed"):
        load("trex", files=[str(path)], task="facts", on_bad_rows="error")


def test_a_folder_a_glob_and_limit(tmp_path):
    (tmp_path / "d").mkdir()
    _write(tmp_path / "d" / "a.txt", "A one.\n\nA two.\n")
    _jsonl(tmp_path / "d" / "b.jsonl", {"text": "B one."})
    _write(tmp_path / "d" / "notes.md", "not read")
    assert [r.text for r in load("text", files=[str(tmp_path / "d")], task="clm").records] == ["A one.", "A two.", "B one."]
    assert [r.text for r in load("text", files=[str(tmp_path / "d" / "*.txt")], task="clm").records] == ["A one.", "A two."]
    limited = load("text", files=[str(tmp_path / "d")], task="clm", limit=2)
    assert len(limited.records) == 2 and limited.source.endswith(", first 2")
    with pytest.raises(DataError, match="limit"):
        load("text", files=[str(tmp_path / "d")], task="clm", limit=0)


def test_split_entries_and_a_seeded_carve(tmp_path):
    val = _write(tmp_path / "v.txt", "V one.\n\nV two.\n")
    test = _write(tmp_path / "t.txt", "\n\n".join(f"T {i}." for i in range(20)) + "\n")
    files = [f"validation={val}", f"test={test}"]
    assert [r.text for r in load("text", "validation", files, task="clm").records] == ["V one.", "V two."]
    assert len(load("text", files=files, task="clm").records) == 20
    parts = [load("text", f"test:{p}", files, task="clm").records for p in ("train", "validation", "test")]
    assert [len(p) for p in parts] == [16, 2, 2] and not {r.id for r in parts[1]} & {r.id for r in parts[2]}
    assert parts[2] == load("text", "test:test", files, task="clm").records  # seeded


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("content", ["", "\n\n   \n", "\ufeff"])
@pytest.mark.parametrize("name", ["empty.txt", "empty.jsonl"])
def test_an_empty_file_or_one_without_a_document_is_refused_naming_it(tmp_path, name, content):
    path = _write(tmp_path / name, content)
    ok = _write(tmp_path / "ok.txt", "A document.\n")
    with pytest.raises(DataError, match=rf"^{path}: no document in it: the file is empty"):
        load("text", files=[str(ok), str(path)], task="clm")


def test_a_file_that_is_not_utf8_is_refused_naming_file_and_line(tmp_path):
    path = tmp_path / "latin.txt"
    path.write_bytes(b"Fine.\n\nAlso fine.\ncaf\xe9 au lait\n")
    with pytest.raises(DataError, match=rf"^{path}:4: not UTF-8 text \(invalid continuation byte at byte 4 of that line\)"):
        load("text", files=[str(path)], task="clm")
    far = tmp_path / "far.jsonl"  # past the reader's first buffer: the line is still the file's
    far.write_bytes(b"".join(b'{"text": "row %d"}\n' % i for i in range(2000)) + b'{"text": "\xff"}\n')
    with pytest.raises(DataError, match=rf"^{far}:2001: not UTF-8 text \(invalid start byte at byte 11"):
        load("trex", files=[str(far)], task="clm")


BAD_FACTS = [  # (row, reason the problem gives)
    ({"entities": [[0, 1]]}, "missing 'text'"),
    ({"text": "", "entities": [[0, 1]]}, "empty 'text'"),
    ({"text": "   ", "entities": [[0, 1]]}, "empty 'text'"),
    ({"text": 7, "entities": [[0, 1]]}, "'text' should be a string, got a number"),
    ({"text": "Rome is old."}, "missing 'entities'"),
    ({"text": "Rome is old.", "entities": []}, "'entities' is empty"),
    ({"text": "Rome is old.", "entities": {"0": 4}}, "'entities' should be a list of [start, end] spans, got an object"),
    ({"text": "Rome is old.", "entities": [[0, 4, 1]]}, "entities[0] should be [start, end], two whole numbers"),
    ({"text": "Rome is old.", "entities": [[0.0, 4]]}, "entities[0] should be [start, end]"),
    ({"text": "Rome is old.", "entities": [[True, 4]]}, "entities[0] should be [start, end]"),
    ({"text": "Rome is old.", "entities": ["Rome"]}, 'entities[0] should be [start, end], two whole numbers (character offsets), got "Rome"'),
    ({"text": "Rome is old.", "entities": [[0, 4], [8, 40]]}, "entities[1] [8, 40] is out of range: the text has 12 characters"),
    ({"text": "Rome is old.", "entities": [[-1, 4]]}, "entities[0] [-1, 4] is out of range"),
    ({"text": "Rome is old.", "entities": [[4, 0]]}, "entities[0] [4, 0] is reversed or empty"),
    ({"text": "Rome is old.", "entities": [[3, 3]]}, "entities[0] [3, 3] is reversed or empty"),
    ({"text": "Rome is old.", "entities": [[8, 11], [0, 6], [5, 7]]}, "entities[1] [0, 6] and entities[2] [5, 7] overlap"),
    ({"text": "Rome is old.", "entities": [[4, 5]]}, "entities[0] [4, 5] covers only whitespace"),
    ("[1, 2]", "row should be a JSON object, got a list"),
    ("{not json", "invalid JSON"),
]


@pytest.mark.parametrize("row, reason", BAD_FACTS, ids=[r for _, r in BAD_FACTS])
def test_each_bad_facts_row_is_skipped_with_its_file_and_line_or_refused(tmp_path, row, reason):
    good = {"text": "Oslo is in Norway.", "entities": [[11, 17], [0, 4]]}  # not sorted: fine
    path = _jsonl(tmp_path / "rows.jsonl", good, "", row, good | {"id": "other"})
    loaded = load("trex", files=[str(path)], task="facts")
    assert [r.entities for r in loaded.records] == [((0, 4), (11, 17))] * 2
    [problem] = loaded.problems
    assert (problem.file, problem.line) == (str(path), 3) and reason in problem.reason
    assert str(problem).startswith(f"{path}:3: ")
    with pytest.raises(DataError, match=rf"1 bad rows in trex facts test from {path} \(2 usable\):\n  {path}:3: ") as err:
        load("trex", files=[str(path)], task="facts", on_bad_rows="error")
    assert "Load.problems" in str(err.value)


def test_a_duplicate_id_is_a_problem_and_a_file_of_bad_rows_is_refused(tmp_path):
    path = _jsonl(tmp_path / "dup.jsonl", {"id": "x", "text": "One."}, {"id": "x", "text": "Two."})
    loaded = load("text", files=[str(path)], task="clm")
    assert [r.text for r in loaded.records] == ["One."] and "duplicate id 'x'" in loaded.problems[0].reason
    bad = _jsonl(tmp_path / "bad.jsonl", {"text": ""}, {"txt": "x"})
    with pytest.raises(DataError, match=rf"No usable rows in text clm test from {bad}: all 2 rows were rejected. "
                                        rf"The first: {bad}:1: empty 'text'"):
        load("text", files=[str(bad)], task="clm")


def test_a_plain_text_file_cannot_feed_facts(tmp_path):
    path = _write(tmp_path / "plain.txt", "No spans here.\n")
    with pytest.raises(DataError, match=rf"{path}: a plain-text file marks no entities"):
        load("trex", files=[str(path)], task="facts")


def test_restricted_reads_apply(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "out").mkdir()
    inside = _write(tmp_path / "in" / "a.txt", "Inside.\n")
    outside = _write(tmp_path / "out" / "b.txt", "Outside.\n")
    (tmp_path / "in" / "link.txt").symlink_to(outside)
    with restricted([tmp_path / "in"]):
        assert [r.text for r in load("text", files=[str(inside)], task="clm").records] == ["Inside."]
        with pytest.raises(PathNotAllowed):
            load("text", files=[str(tmp_path / "in" / "link.txt")], task="clm")


# ---------------------------------------------------------------- datasets and tasks


def test_which_dataset_feeds_which_task():
    assert dataset_names("clm") == ["synthetic", "text", "trex"]
    assert dataset_names("facts") == ["synthetic", "trex"]
    mcq = dataset_names("mcq")
    assert "text" not in mcq and "trex" not in mcq and "synthetic" in mcq
    assert set(dataset_names(None)) == set(DATASETS.names())
    assert all(DATASETS.get(n).tasks == ("mcq",) for n in mcq if n != "synthetic")
    assert DATASETS.get("synthetic").tasks == ("mcq", "clm", "facts")
    with pytest.raises(DataError, match="Unknown task 'bogus'"):
        dataset_names("bogus")


def test_multiple_choice_refuses_a_text_dataset_and_texts_refuse_the_wrong_dataset(tmp_path):
    with pytest.raises(DataError, match=r"^dataset 'text' holds texts, not questions: use task clm"):
        load("text", "test", ["bundled"])
    with pytest.raises(DataError, match=r"^dataset 'trex' holds texts, not questions: use task facts or clm"):
        load("trex")
    with pytest.raises(DataError, match=r"^dataset 'obqa' holds questions, not texts: use task mcq, or a dataset "
                                        r"for clm: synthetic, text, trex\."):
        load("obqa", files=["bundled"], task="clm")
    with pytest.raises(DataError, match=r"^dataset 'text' holds texts without entity spans: .* for facts use one "
                                        r"of: synthetic, trex\."):
        load("text", files=["bundled"], task="facts")
    with pytest.raises(DataError, match="Unknown task 'bogus'"):
        load("text", files=["bundled"], task="bogus")
    with pytest.raises(DataError, match="text has no copy on the Hugging Face hub: set data_files .* or to "
                                        r"\[bundled\]"):
        load("text", task="clm")


# ---------------------------------------------------------------- the bundled samples


@pytest.mark.parametrize("dataset, task, split, n, entities", [
    ("text", "clm", "validation", 150, 0), ("text", "clm", "test", 150, 0),
    ("trex", "facts", "test", 29, 53), ("trex", "clm", "test", 29, 0),
    ("synthetic", "facts", "train", 2000, 2000), ("synthetic", "facts", "validation", 500, 500),
    ("synthetic", "facts", "test", 1000, 1000), ("synthetic", "clm", "shifted", 1000, 0)])
def test_the_bundled_samples_load(dataset, task, split, n, entities):
    loaded = load(dataset, split, ["bundled"], task=task)
    assert len(loaded.records) == n and loaded.problems == [] and len({r.id for r in loaded.records}) == n
    assert sum(len(r.entities) for r in loaded.records) == entities
    assert f"{dataset} {task} {split} from the bundled sample (" in loaded.source
    assert {r.source for r in loaded.records} == {dataset}


def test_the_shakespeare_splits_are_long_disjoint_paragraphs():
    val, test = (load("text", s, ["bundled"], task="clm").records for s in ("validation", "test"))
    assert all(len(r.text.split()) >= 40 for r in val + test)
    assert not {r.text for r in val} & {r.text for r in test}


def test_the_trex_sample_spans_are_words_of_their_sentences():
    for record in load("trex", files=["bundled"], task="facts").records:
        assert len(record.meta["entity_uris"]) == len(record.entities)
        for start, end in record.entities:
            surface = record.text[start:end]
            assert surface == surface.strip() and surface[0].isalnum()
            assert start == 0 or not record.text[start - 1].isalnum()  # a whole word
    first = load("trex", files=["bundled"], task="facts").records[0]
    assert [first.text[s:e] for s, e in first.entities][-2:] == ["Spain", "France"]


def test_synthetic_statements_carry_the_stated_colour_as_their_entity_and_the_true_distribution():
    questions = load("synthetic", "test", ["bundled"]).records
    facts = load("synthetic", files=["bundled"], task="facts").records
    clm = load("synthetic", files=["bundled"], task="clm").records
    assert len(questions) == len(facts) == len(clm)
    for question, fact, text in zip(questions, facts, clm):
        [(start, end)] = fact.entities
        assert fact.text[start:end] == question.choices[question.answer] and fact.text[end:] == "."
        assert fact.id == question.id and fact.origin == question.origin and text.text == fact.text
        card, light = question.question.split(".")[0], question.meta["light"]
        assert fact.text.startswith(f"{card}. In {light} light, the ") and " looks " in fact.text
        assert fact.meta["true_probs"] == question.meta["true_probs"] and fact.meta["light"] == light
        assert fact.meta["choices"] == list(question.choices) and fact.meta["answer"] == question.answer
        assert text.entities == () and "true_probs" not in text.meta  # random positions: no oracle
    assert facts[0].text == "Card 95915. In dim light, the violin looks green."


def test_a_synthetic_row_that_is_no_question_of_the_task_is_a_problem(tmp_path):
    row = {"question": "What colour is the sky?", "choices": ["red", "blue"], "answer": 1, "true_probs": [0.5, 0.5]}
    good = {"question": "Card 12345. In dim light, which colour does the kettle look?", "choices": ["red", "blue"],
            "answer": 0, "true_probs": [0.6, 0.4], "light": "dim"}
    path = _jsonl(tmp_path / "test.jsonl", good, row)
    loaded = load("synthetic", files=[str(path)], task="facts")
    assert [r.text for r in loaded.records] == ["Card 12345. In dim light, the kettle looks red."]
    assert loaded.problems[0].line == 2 and "not a question of the controlled task" in loaded.problems[0].reason
    with pytest.raises(Exception):
        statement(MCQRecord("q", "Plain?", ("a", "b"), 0, "x"))


def test_a_text_record_is_a_value():
    a = TextRecord("x", "Text.", ((0, 4),), "text", {"k": 1}, ("f", 1))
    assert a == TextRecord("x", "Text.", ((0, 4),), "text") and hash(a) == hash(TextRecord("x", "Text.", ((0, 4),), "text"))
    assert a.where == "f:1" and TextRecord("y", "T").where == ""


def test_the_text_samples_are_registered_and_remade_by_their_script(tmp_path):
    assert DATASETS.get("text").bundled == (("validation", "text/validation.txt"), ("test", "text/test.txt"))
    assert DATASETS.get("trex").bundled == (("test", "trex/test.jsonl"),)
    make = script_module("make_text_samples")
    assert make.paragraphs("a\nb\n\n\n c\n") == ["a\nb", " c"]
    doc = {"docid": "http://www.wikidata.org/entity/Q1", "title": "T", "text": "Rome is in Italy. It is old.",
           "sentences_boundaries": [[0, 17], [18, 28]],
           "entities": [{"boundaries": [11, 16], "surfaceform": "Italy", "uri": "Q38", "annotator": "Wikidata_Spotlight_Entity_Linker"},
                        {"boundaries": [0, 4], "surfaceform": "Rome", "uri": "Q220", "annotator": "Wikidata_Spotlight_Entity_Linker"},
                        {"boundaries": [0, 10], "surfaceform": "Rome is in", "uri": "Q0", "annotator": "Date_Linker"},
                        {"boundaries": [5, 10], "surfaceform": "is in", "uri": "P17", "annotator": "Wikidata_Property_Linker"},
                        {"boundaries": [18, 20], "surfaceform": "Rome", "uri": "Q220", "annotator": "Simple_Coreference"}]}
    assert make.trex_rows([doc]) == [{"id": "Q1-0", "text": "Rome is in Italy.", "entities": [[0, 10], [11, 16]],
                                      "title": "T", "docid": doc["docid"], "sentence": 0, "entity_uris": ["Q0", "Q38"]}]
    bundled = samples.ROOT / "text" / "test.txt"
    assert make.paragraphs(bundled.read_text(encoding="utf-8")) == [r.text for r in load("text", files=["bundled"], task="clm").records]


# ---------------------------------------------------------------- templates


class _ChatTokenizer:
    chat_template = "x"

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        assert not tokenize and add_generation_prompt
        return "".join(f"<{m['role']}>{m['content']}</{m['role']}>" for m in messages) + "<assistant>"


def test_the_text_templates_are_the_papers_prompts():
    assert template_names("text") == ["paper_clm", "paper_facts", "plain"]
    assert get_template("plain").text_prefix() == "" and get_template("plain").text_prefix(_ChatTokenizer()) == ""
    assert get_template("paper_clm").text_prefix() == "Finish this sentence:\n"
    assert get_template("paper_facts").text_prefix(None) == "Finish this Wikipedia description:\n"
    assert (get_template("paper_facts").text_prefix(_ChatTokenizer())
            == "<user>Finish this Wikipedia description:</user><assistant>")
    with pytest.raises(DataError, match="is a cloze template: it renders questions, not texts"):
        get_template("cloze_qa").text_prefix()
    record = MCQRecord("q", "Sky?", ("red", "blue"), 1, "x")  # a question: nothing (a scratch tokenizer's corpus)
    assert all(get_template(n).render(record, None) == Prompt("", ()) for n in template_names("text"))
