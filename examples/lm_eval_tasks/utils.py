"""The prompt of medmcqa_local.yaml: the question, its four options lettered A-D, then "Answer:"."""


def doc_to_text(doc: dict) -> str:
    options = [doc["opa"], doc["opb"], doc["opc"], doc["opd"]]
    lines = "\n".join(f"{letter}. {option}" for letter, option in zip("ABCD", options))
    return f"Question: {doc['question'].strip()}\nChoices:\n{lines}\nAnswer:"
