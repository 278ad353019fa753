"""Instruction data for SFT (lab/data/instructions.py): each layout read to its prompt and completion, the
layout told per file, every bad row named file:line (skipped and counted, or refused), the files refused
whole, the limits, the datasets' registration, the bundled Alpaca and Dolly samples and their SOURCES.md
entries, the sample script, and the records as TRL's SFTTrainer takes them (its format checks, the bundled
model's chat template)."""
import json
import random
import re
from pathlib import Path

import pytest

from lab.data import DataError, InstructionRecord, dataset_names, instructions, load, loading, samples, with_sample
from tests.helpers import script_module

REPO = Path(__file__).resolve().parents[2]
ALPACA = {"instruction": "Name a colour.", "input": "", "output": "Blue."}
CHAT = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]}
PLAIN = {"prompt": "2 + 2 =", "completion": " 4"}
DOLLY = {"instruction": "Who wrote it?", "context": "Hamlet is by Shakespeare.", "response": "Shakespeare.",
         "category": "closed_qa"}


def _jsonl(path: Path, *rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def _load(path: Path, **kwargs):
    return load("instructions", "train", [str(path)], task="sft", **kwargs)


def _user(text: str) -> tuple[dict, ...]:
    return ({"role": "user", "content": text},)


# ---------------------------------------------------------------- the layouts


@pytest.mark.unit
def test_alpaca_rows_put_the_input_after_the_instruction_and_a_blank_line(tmp_path):
    path = _jsonl(tmp_path / "a.jsonl", {"id": "x", "instruction": "Translate.", "input": "Bonjour", "output": "Hello"},
                  ALPACA, {"instruction": "No input field.", "output": "Fine.", "source": "me"},
                  {"instruction": "Blank input.", "input": "  ", "output": "Kept out."})
    loaded = _load(path)
    assert loaded.problems == [] and loaded.source == f"instructions train from {path} (4 rows, 0 skipped)"
    assert [(r.id, r.prompt, r.completion, r.meta, r.origin) for r in loaded.records] == [
        ("x", _user("Translate.\n\nBonjour"), "Hello", {}, (str(path), 1)),
        ("a-2", _user("Name a colour."), "Blue.", {}, (str(path), 2)),
        ("a-3", _user("No input field."), "Fine.", {"source": "me"}, (str(path), 3)),
        ("a-4", _user("Blank input."), "Kept out.", {}, (str(path), 4))]
    assert all(isinstance(r, InstructionRecord) and r.source == "instructions" for r in loaded.records)


@pytest.mark.unit
def test_chat_rows_prompt_with_every_message_before_the_last_assistant_turn(tmp_path):
    turns = [{"role": "system", "content": ""}, {"role": "user", "content": "Hi"},
             {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye?", "name": "u"},
             {"role": "assistant", "content": "Bye."}]
    [record] = _load(_jsonl(tmp_path / "c.jsonl", {"messages": turns, "lang": "en"})).records
    assert record.prompt == tuple({"role": t["role"], "content": t["content"]} for t in turns[:4])
    assert record.completion == "Bye." and record.meta == {"lang": "en"}


@pytest.mark.unit
def test_prompt_completion_and_dolly_rows_and_a_json_list(tmp_path):
    plain = _load(_jsonl(tmp_path / "p.jsonl", PLAIN)).records[0]
    assert (plain.prompt, plain.completion) == (_user("2 + 2 ="), " 4")
    dolly = _load(_jsonl(tmp_path / "d.jsonl", DOLLY, {**DOLLY, "context": ""})).records
    assert [(r.prompt, r.completion, r.meta) for r in dolly] == [
        (_user("Who wrote it?\n\nHamlet is by Shakespeare."), "Shakespeare.", {"category": "closed_qa"}),
        (_user("Who wrote it?"), "Shakespeare.", {"category": "closed_qa"})]
    listed = tmp_path / "l.json"
    listed.write_text(json.dumps([ALPACA, {"instruction": "Two?", "output": "2"}], indent=2), encoding="utf-8")
    assert [(r.id, r.completion) for r in _load(listed).records] == [("l-2", "Blue."), ("l-7", "2")]


@pytest.mark.unit
def test_the_trl_example_is_a_fresh_conversational_prompt_completion(tmp_path):
    record = _load(_jsonl(tmp_path / "c.jsonl", CHAT)).records[0]
    example = record.example()
    assert example == {"prompt": [{"role": "user", "content": "Hi"}],
                       "completion": [{"role": "assistant", "content": "Hello!"}]}
    example["prompt"][0]["content"] = "changed"
    assert record.prompt == _user("Hi") and hash(record) == hash(record)


@pytest.mark.unit
def test_each_file_has_its_own_layout_and_a_mixed_file_keeps_its_first_good_rows(tmp_path):
    first = _jsonl(tmp_path / "first.jsonl", CHAT, PLAIN)
    second = _jsonl(tmp_path / "second.jsonl", {"instruction": "x", "output": ""}, PLAIN, ALPACA,
                    {"instruction": "Only an instruction."})
    loaded = load("instructions", "train", [str(first), str(second)], task="sft")
    assert [r.where for r in loaded.records] == [f"{first}:1", f"{second}:2"]
    assert [str(p) for p in loaded.problems] == [
        f"{first}:2: a row of the prompt-completion layout in a file of chat rows (the layout of its first good row, "
        "line 1): one file holds one layout; split it in two",
        f"{second}:1: empty response: 'output' is blank, so there is nothing to learn",
        *(f"{second}:{line}: a row of the Alpaca layout in a file of prompt-completion rows (the layout of its "
          "first good row, line 2): one file holds one layout; split it in two" for line in (3, 4))]
    dolly = _load(_jsonl(tmp_path / "dolly.jsonl", DOLLY, {"instruction": "Only an instruction."})).problems
    assert [p.reason for p in dolly] == ["missing 'response'"]  # read as the file's layout, Dolly


# ---------------------------------------------------------------- bad rows

BAD_ROWS = [
    ('{"instruction": "x",', "alpaca", r"invalid JSON: .* at column \d+"),
    ("[1, 2]", "alpaca", "row should be a JSON object, got a list"),
    ('"text"', "alpaca", "row should be a JSON object, got a string"),
    ({}, "alpaca", "missing fields: no 'instruction', 'messages' or 'prompt'. Expected JSON Lines"),
    ({"input": "x", "output": "y"}, "alpaca", "missing 'instruction'"),
    ({"instruction": "x"}, "alpaca", "missing 'output'"),
    ({"instruction": "x", "output": None}, "alpaca", "missing 'output'"),
    ({"prompt": "x"}, "plain", "missing 'completion'"),
    ({"instruction": ["a", "b"], "output": "y"}, "alpaca", "'instruction' should be a string, got a list"),
    ({"instruction": "x", "output": {"text": "y"}}, "alpaca", "'output' should be a string, got an object"),
    ({"instruction": "x", "output": 42}, "alpaca", "'output' should be a string, got a number"),
    ({"instruction": "x", "input": 3, "output": "y"}, "alpaca", "'input' should be a string .*, got a number"),
    ({"instruction": "x", "context": ["c"], "response": "y"}, "dolly", "'context' should be a string .*, got a list"),
    ({"prompt": [{"role": "user", "content": "x"}], "completion": "y"}, "plain",
     r"'prompt' should be a string, got a list \(a conversation goes in 'messages'"),
    ({"prompt": "x", "completion": 1.5}, "plain", "'completion' should be a string, got a number"),
    ({"messages": "hi"}, "chat", "'messages' should be a list of .*, got a string"),
    ({"messages": ["hi"]}, "chat", r"messages\[0\] should be a JSON object, got a string"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}, CHAT["messages"][1]]}, "chat",
     r"'messages\[0\].content' should be a string, got a list"),
    ({"messages": [{"content": "x"}, CHAT["messages"][1]]}, "chat", r"missing 'messages\[0\].role'"),
    ({"messages": [{"role": 1, "content": "x"}]}, "chat", r"'messages\[0\].role' should be a string, got a number"),
    ({"instruction": "x", "output": " \n\t"}, "alpaca", "empty response: 'output' is blank"),
    ({"prompt": "x", "completion": "\n"}, "plain", "empty response: 'completion' is blank"),
    ({"instruction": "x", "context": "", "response": ""}, "dolly", "empty response: 'response' is blank"),
    ({"messages": [CHAT["messages"][0], {"role": "assistant", "content": "  "}]}, "chat",
     r"empty response: messages\[1\], the assistant's last turn, is blank"),
    ({"instruction": " ", "output": "y"}, "alpaca", "empty 'instruction'"),
    ({"messages": [{"role": "user", "content": " "}, CHAT["messages"][1]]}, "chat",
     r"messages\[0\], a user turn, is blank"),
    ({"messages": [CHAT["messages"][0]]}, "chat",
     r"the last message, messages\[0\], is the user's: a chat row ends with the assistant's response"),
    ({"messages": [{"role": "tool", "content": "x"}, CHAT["messages"][1]]}, "chat",
     r"messages\[0\] has the unknown role 'tool': expected system, user, assistant"),
    ({"messages": [{"role": "system", "content": "Be brief."}, CHAT["messages"][1]]}, "chat",
     r"the assistant's last turn, messages\[1\], answers no user turn \(messages\[0\] is the system's\)"),
    ({"messages": [CHAT["messages"][1]]}, "chat",
     r"the assistant's last turn, messages\[0\], answers no user turn \(nothing comes before it\)"),
    ({"messages": []}, "chat", "'messages' is empty"),
    ({**ALPACA, "messages": CHAT["messages"]}, "alpaca",
     "the row has the fields of 2 layouts \\(Alpaca: output, input; chat: messages\\): keep one layout's fields"),
]
GOOD = {"alpaca": ALPACA, "chat": CHAT, "plain": PLAIN, "dolly": DOLLY}


@pytest.mark.unit
@pytest.mark.parametrize("row, layout, reason", BAD_ROWS)
def test_every_bad_row_is_named_by_file_and_line_skipped_and_counted_or_refused(tmp_path, row, layout, reason):
    path = _jsonl(tmp_path / "data.jsonl", GOOD[layout], "", row, GOOD[layout])
    loaded = _load(path)
    assert [r.where for r in loaded.records] == [f"{path}:1", f"{path}:4"]
    [problem] = loaded.problems
    assert (problem.file, problem.line) == (str(path), 3) and re.match(reason, problem.reason)
    assert "(2 rows, 1 skipped)" in loaded.source
    with pytest.raises(DataError, match=rf"^1 bad rows in instructions train from {path} \(2 usable\):\n  "
                                        rf"{path}:3: {reason}") as refused:
        _load(path, on_bad_rows="error")
    assert refused.value.problems == (problem,)


@pytest.mark.unit
def test_refusing_names_the_first_five_and_counts_the_rest_and_all_bad_is_refused_either_way(tmp_path):
    path = _jsonl(tmp_path / "d.jsonl", ALPACA, *[{"instruction": f"{i}", "output": ""} for i in range(7)])
    with pytest.raises(DataError, match=r"^7 bad rows .*\n(  .*d\.jsonl:\d: empty response.*\n){5}  \.\.\. and 2 more"):
        _load(path, on_bad_rows="error")
    bad = _jsonl(tmp_path / "bad.jsonl", {"instruction": "x", "output": ""}, "[]")
    with pytest.raises(DataError, match=rf"^No usable rows in .*: all 2 rows were rejected\. The first: {bad}:1: "):
        _load(bad)


@pytest.mark.unit
def test_a_repeated_id_is_a_bad_row_the_first_kept(tmp_path):
    path = _jsonl(tmp_path / "d.jsonl", {"id": 7, **ALPACA}, {"id": "7", **ALPACA})
    loaded = _load(path)
    assert [r.id for r in loaded.records] == ["7"]
    [problem] = loaded.problems
    assert problem.line == 2 and problem.reason.startswith(f"duplicate id '7': first seen at {path}:1")


# ---------------------------------------------------------------- whole files and limits


@pytest.mark.unit
@pytest.mark.parametrize("text", ["", "\n  \n", "[]", " [ ] "])
def test_an_empty_file_is_refused_by_name(tmp_path, text):
    path = tmp_path / "empty.jsonl"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(DataError, match=rf"^{path}: no rows in it: the file is empty .*Expected JSON Lines or a JSON"):
        _load(path)


@pytest.mark.unit
def test_a_file_that_is_not_utf8_or_not_a_json_list_is_refused_by_name_and_line(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(json.dumps(ALPACA).encode() + b'\n{"instruction": "caf\xe9", "output": "x"}\n')
    with pytest.raises(DataError, match=rf"^{path}:2: not UTF-8 text \(invalid continuation byte at byte 21 of that"):
        _load(path)
    broken = tmp_path / "broken.json"
    broken.write_text(f"[{json.dumps(ALPACA)},\n{{\"instruction\": }}]", encoding="utf-8")
    with pytest.raises(DataError, match=rf"^{broken}:2: invalid JSON"):
        _load(broken)


@pytest.mark.unit
def test_more_rows_than_the_limit_are_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(loading, "MAX_ROWS", 3)
    path = _jsonl(tmp_path / "d.jsonl", ALPACA, ALPACA, "oops", ALPACA)
    with pytest.raises(DataError, match=r"^instructions train from .*d\.jsonl: more than 3 rows, the most one load"):
        _load(path)
    assert len(_load(_jsonl(tmp_path / "e.jsonl", ALPACA, "oops", ALPACA)).records) == 2


@pytest.mark.unit
def test_a_huge_row_is_refused_without_quoting_it(tmp_path, monkeypatch):
    assert instructions.MAX_CHARS == 16 * 2**20
    monkeypatch.setattr(instructions, "MAX_CHARS", 1_000_000)
    huge = "x" * 1_000_001
    long_answer = {"messages": [CHAT["messages"][0], {"role": "assistant", "content": huge}]}
    long_role = {"messages": [{"role": huge, "content": "x"}, CHAT["messages"][1]]}
    path = _jsonl(tmp_path / "d.jsonl", CHAT, long_answer, long_role)
    first, second = _load(path).problems
    assert first.reason == "the row's texts hold 1,000,003 characters, more than the 1,000,000 a row may hold"
    assert second.reason == f"messages[0] has the unknown role '{'x' * 40}…': expected system, user, assistant"


@pytest.mark.unit
def test_limit_the_carve_and_the_options_are_those_of_every_loader(tmp_path):
    path = _jsonl(tmp_path / "d.jsonl", *[{"instruction": f"Q{i}", "output": f"A{i}"} for i in range(20)])
    assert [r.completion for r in _load(path, limit=3).records] == ["A0", "A1", "A2"]
    part = load("instructions", "train:validation", [str(path)], task="sft", seed=1)
    again = load("instructions", "train:validation", [str(path)], task="sft", seed=1)
    assert len(part.records) == 2 and part.records == again.records
    assert part.source.endswith("(20 rows, 0 skipped), the validation part of a seed-1 0.8/0.1/0.1 carve: 2 rows")
    named = load("instructions", "validation", [f"validation={path}"], task="sft", limit=1)
    assert len(named.records) == 1
    with pytest.raises(DataError, match="on_bad_rows to be 'skip' or 'error'"):
        _load(path, on_bad_rows="ignore")
    with pytest.raises(DataError, match="limit to be a positive integer"):
        _load(path, limit=0)


# ---------------------------------------------------------------- the datasets


@pytest.mark.unit
def test_the_instruction_datasets_feed_sft_only_and_are_refused_elsewhere(tmp_path):
    assert dataset_names("sft") == ["alpaca", "dolly", "instructions"]
    assert not {"alpaca", "dolly", "instructions"} & {*dataset_names("mcq"), *dataset_names("clm")}
    with pytest.raises(DataError, match=r"^dataset 'obqa' holds questions, not instruction-response pairs; for sft "
                                        r"use one of: alpaca, dolly, instructions\.$"):
        load("obqa", "train", ["bundled"], task="sft")
    with pytest.raises(DataError, match="dataset 'text' holds texts, not instruction-response pairs"):
        load("text", "test", ["bundled"], task="sft")
    with pytest.raises(DataError, match="holds instruction-response pairs, not questions: use task sft"):
        load("alpaca", "train", ["bundled"])
    with pytest.raises(DataError, match="holds instruction-response pairs, not texts: use task sft"):
        load("alpaca", files=["bundled"], task="clm")
    with pytest.raises(DataError, match=r"^alpaca is read from files only: set data_files .* or to \[bundled\]"):
        load("alpaca", task="sft")
    with pytest.raises(DataError, match="^instructions has no bundled sample; 'bundled' in data_files names one for: "
                                        "alpaca, arc_challenge, arc_easy, boolq, dolly"):
        load("instructions", "train", ["bundled"], task="sft")
    path = _jsonl(tmp_path / "mine.jsonl", DOLLY)
    assert all(len(load(n, "train", [str(path)], task="sft").records) == 1 for n in ("alpaca", "dolly"))


@pytest.mark.unit
def test_the_bundled_alpaca_sample_loads_with_its_advertised_counts_and_licence():
    train, validation = (load("alpaca", split, ["bundled"], task="sft") for split in ("train", "validation"))
    assert (len(train.records), len(validation.records), train.problems, validation.problems) == (400, 100, [], [])
    assert train.source == "alpaca train from the bundled sample (alpaca/train.jsonl) (400 rows, 0 skipped)"
    ids = [r.id for r in train.records + validation.records]
    assert len(set(ids)) == 500 and all(i.startswith("alpagasus_random_9k-") for i in ids)
    assert all(len(r.prompt) == 1 and r.prompt[0]["role"] == "user" and r.completion.strip()
               for r in train.records + validation.records)
    assert "alpaca" in with_sample()
    sizes = [(samples.ROOT / "alpaca" / f).stat().st_size for f in ("train.jsonl", "validation.jsonl")]
    assert sum(sizes) < 300_000
    sources = (samples.ROOT / "SOURCES.md").read_text(encoding="utf-8")
    for needed in ("`alpaca/train.jsonl`, `alpaca/validation.jsonl` (400 / 100 rows", "CC BY-NC 4.0",
                   "non-commercial", "gpt4life/alpagasus", "scripts/make_instruction_samples.py"):
        assert needed in sources, needed


@pytest.mark.unit
def test_the_bundled_dolly_sample_loads_every_row_with_its_context_as_alpaca_s_input():
    categories, rows = set(), 0
    for split, n in (("train", 145), ("validation", 48)):
        path = samples.ROOT / "dolly" / f"{split}.jsonl"
        lines = path.read_text(encoding="ascii").splitlines()
        loaded = load("dolly", split, ["bundled"], task="sft")
        assert (len(lines), len(loaded.records), loaded.problems) == (n, n, [])
        assert loaded.source == f"dolly {split} from the bundled sample (dolly/{split}.jsonl) ({n} rows, 0 skipped)"
        for line, record in zip(lines, loaded.records):
            row = json.loads(line)
            assert list(row) == ["id", "instruction", "context", "response", "category"]
            assert row["id"] == record.id and row["id"].startswith("dolly-offset-")
            assert len(row["context"]) <= 700 and len(row["response"]) <= 700
            prompt = f"{row['instruction']}\n\n{row['context']}" if row["context"].strip() else row["instruction"]
            assert record.prompt == _user(prompt) and record.completion == row["response"]
            assert record.meta == {"category": row["category"]}
            categories.add(row["category"])
        rows += n
    assert categories == {"brainstorming", "classification", "closed_qa", "creative_writing", "general_qa",
                          "information_extraction", "open_qa", "summarization"}
    assert "dolly" in with_sample()
    sources = (samples.ROOT / "SOURCES.md").read_text(encoding="utf-8")
    for needed in ("`dolly/train.jsonl`, `dolly/validation.jsonl` (145 / 48 rows", "CC BY-SA 3.0",
                   "LICENSES/CC-BY-SA-3.0.txt", "yogarajjsoshua/FlaskApplication", f"{rows} rows"):
        assert needed in sources, needed


@pytest.mark.unit
def test_the_script_remakes_the_alpaca_sample_from_shared(shared_data, capsys):
    make = script_module("make_instruction_samples")
    assert make.main(["--alpaca", str(shared_data / "alpaca" / "alpagasus_random_9k.json"), "--check"]) == 0
    assert capsys.readouterr().out == "the bundled files are as this script makes them\n"


@pytest.mark.unit
def test_the_script_draws_dolly_rows_byte_for_byte_from_a_file_of_its_shape(tmp_path):
    make = script_module("make_instruction_samples")
    rng = random.Random(5)
    rows = [json.dumps({"instruction": f"Q{i}", "context": rng.choice(["", f"C{i}"]), "response": f"A{i}",
                        "category": "open_qa"}) for i in range(make.DOLLY_ROWS)]
    splits = make.dolly_splits(("\n".join(rows) + "\n").encode())
    lines = {split: text.splitlines() for split, text in splits.items()}
    assert (len(lines["train"]), len(lines["validation"])) == (400, 100)
    assert set(lines["train"] + lines["validation"]) <= set(rows) and not set(lines["train"]) & set(lines["validation"])
    assert lines["train"] == sorted(lines["train"], key=rows.index)
    (tmp_path / "train.jsonl").write_text(splits["train"], encoding="utf-8")
    loaded = load("dolly", "train", [str(tmp_path / "train.jsonl")], task="sft")
    assert len(loaded.records) == 400 and {r.meta["category"] for r in loaded.records} == {"open_qa"}
    with pytest.raises(ValueError, match="not databricks-dolly-15k.jsonl: .* this file has 15,010 rows"):
        make.dolly_splits(("\n".join(rows[1:]) + "\n").encode())


# ---------------------------------------------------------------- as TRL takes them


@pytest.mark.unit
def test_trl_reads_every_layout_as_a_conversational_prompt_completion(tmp_path):
    from trl.data_utils import is_conversational

    for name, row in GOOD.items():
        record = _load(_jsonl(tmp_path / f"{name}.jsonl", row)).records[0]
        example = record.example()
        assert is_conversational(example) and set(example) == {"prompt", "completion"}
        assert example["prompt"][-1]["role"] == "user" and example["completion"][0]["content"] == record.completion


@pytest.fixture(scope="module")
def tokenizer():
    """The bundled model's tokenizer alone (its tests are marked `model`: the first use converts the GGUF)."""
    from transformers import AutoTokenizer

    from lab.models.bundled import bundled_model_dir

    return AutoTokenizer.from_pretrained(bundled_model_dir())


@pytest.mark.model
def test_the_bundled_chat_template_puts_the_completion_right_after_the_prompt(tmp_path, tokenizer):
    from trl.data_utils import apply_chat_template, common_prefix_length

    turns = {"messages": [{"role": "system", "content": "Be brief."}, *CHAT["messages"],
                          {"role": "user", "content": "And again?"}, {"role": "assistant", "content": "Hello again!"}]}
    for row in (turns, {"instruction": "Translate.", "input": "Bonjour", "output": "Hello"}):
        record = _load(_jsonl(tmp_path / "d.jsonl", row)).records[0]
        text = apply_chat_template(record.example(), tokenizer)
        assert text["prompt"].endswith("<|im_start|>assistant\n")
        assert text["completion"] == f"{record.completion}<|im_end|>\n"
        whole = tokenizer.apply_chat_template([*record.example()["prompt"], *record.example()["completion"]],
                                              tokenize=False)
        assert text["prompt"] + text["completion"] == whole
        prompt_ids = tokenizer(text["prompt"], add_special_tokens=False)["input_ids"]
        whole_ids = tokenizer(whole, add_special_tokens=False)["input_ids"]
        assert common_prefix_length(prompt_ids, whole_ids) == len(prompt_ids) < len(whole_ids)
