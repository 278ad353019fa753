import pytest

from lab.core.registry import UnknownNameError
from lab.data import load
from lab.data.record import MCQRecord
from lab.data.templates import default_template, get_template, template_names


@pytest.mark.unit
def test_first_lower_reproduces_the_papers_csqa_example(shared_data):
    # FIRST, Table 3: the CSQA prompt for the first training question, up to the answer letter.
    records = load("csqa", "train", [str(shared_data / "commonsenseqa" / "train.jsonl")], limit=1).records
    prompt = get_template("first_lower").render(records[0], None)
    assert prompt.text == (
        "Q: The sanctions against the school were a punishing blow, and they seemed to what the efforts the "
        "school had made to change? Answer Choices: (a) ignore (b) enforce (c) authoritarian (d) yell at "
        "(e) avoid A: The answer is ("
    )
    assert prompt.options == ("a", "b", "c", "d", "e")


@pytest.mark.unit
def test_first_boolq_is_the_papers_alpaca_format():
    record = MCQRecord("1", "is windows movie maker part of windows essentials", ("No", "Yes"), 1, "boolq",
                       passage="Windows Movie Maker is a part of Windows Essentials.")
    prompt = get_template("first_boolq").render(record, None)
    assert prompt.text == (
        "Below is an instruction that describes a task. Write a response that appropriately completes the request."
        "\n\n### Instruction:\nRead the input passage and answer the question: is windows movie maker part of "
        "windows essentials? Your answer should be Yes or No.\n\n### Input:\nWindows Movie Maker is a part of "
        "Windows Essentials.\n\n### Response:\n"
    )
    assert prompt.options == ("No", "Yes")  # in choice order: index 1 is "Yes"


@pytest.mark.model
def test_cft_chat_uses_the_models_chat_template(bundled):
    record = MCQRecord("q", "Which is very difficult to induce antibody?", ("Polysaccharide", "Protein"), 0, "custom")
    prompt = get_template("cft_chat").render(record, bundled.tokenizer)
    assert prompt.chat
    assert prompt.text.startswith("<|im_start|>system\nYou are an AI assistant that answers multiple choice")
    assert "Options:\nA. Polysaccharide\nB. Protein\nAnswer with only a single letter:<|im_end|>" in prompt.text
    assert prompt.text.endswith("<|im_start|>assistant\n")
    assert prompt.options == ("A", "B")


@pytest.mark.unit
def test_cft_chat_without_chat_template_falls_back_to_plain_text():
    record = MCQRecord("q", "2+2?", ("3", "4"), 1, "custom")
    prompt = get_template("cft_chat").render(record, None)
    assert not prompt.chat and prompt.text.endswith("Answer with only a single letter:")
    assert prompt.options == (" A", " B")


@pytest.mark.unit
def test_cloze_templates_match_lm_evaluation_harness():
    record = MCQRecord("q", "Which gas do plants take in?", ("oxygen", "carbon dioxide"), 1, "arc_challenge")
    qa = get_template("cloze_qa").render(record, None)
    assert qa.text == "Question: Which gas do plants take in?\nAnswer:" and qa.options == (" oxygen", " carbon dioxide")
    assert get_template("cloze_plain").render(record, None).text == "Which gas do plants take in?"
    boolq = MCQRecord("b", "is the sky blue", ("No", "Yes"), 1, "boolq", passage="The sky is blue.")
    b = get_template("cloze_boolq").render(boolq, None)
    assert b.text == "The sky is blue.\nQuestion: is the sky blue?\nAnswer:" and b.options == (" no", " yes")


@pytest.mark.unit
def test_defaults_and_kinds():
    assert default_template("boolq", "letter") == "first_boolq"
    assert default_template("obqa", "cloze") == "cloze_plain"
    assert default_template("arc_challenge", "cloze") == "cloze_qa"
    assert set(template_names("cloze")) == {"cloze_qa", "cloze_plain", "cloze_boolq"}
    with pytest.raises(UnknownNameError, match="Did you mean 'first'"):
        get_template("frist")
