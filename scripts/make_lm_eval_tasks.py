"""Write the lm-eval task YAMLs that ship with the lab over its bundled samples (lab/data/bundled/lm_eval/).

    python scripts/make_lm_eval_tasks.py [--check]

Each task keeps lm-eval's own prompt for the dataset's hub copy (its ``doc_to_text``, ``doc_to_choice``,
``doc_to_target``, ``description``, few-shot split and sampler: tests/data/test_lm_eval_tasks.py compares them with the
installed lm-eval's YAMLs) and reads the sample through ``bundled.py`` (``custom_dataset``), which gives the
rows the hub's schema. ``--check`` verifies the files are what this script writes.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent / "lab" / "data" / "bundled"
OUT = ROOT / "lm_eval"
HEADER = ("# Made by scripts/make_lm_eval_tasks.py: lm-eval's prompt for {mirrors}, over the bundled sample "
          "(lab/data/bundled/SOURCES.md).\n")
ARC = {"output_type": "multiple_choice", "doc_to_text": "Question: {{question}}\nAnswer:",
       "doc_to_target": "{{choices.label.index(answerKey)}}", "doc_to_choice": "{{choices.text}}"}
ACC = [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}]
ACC_NORM = ACC + [{"metric": "acc_norm", "aggregation": "mean", "higher_is_better": True}]


def _function(name: str) -> str:
    return f"!function bundled.{name}"


def tasks() -> dict[str, tuple[str, dict]]:
    """file name → (the lm-eval task it mirrors, its config)."""
    out = {
        "bundled_arc_easy.yaml": ("arc_easy", {
            "task": "bundled_arc_easy", "custom_dataset": _function("arc"), "dataset_kwargs": {"sample": "arc_easy"},
            **ARC, "validation_split": "validation", "fewshot_split": "validation", "metric_list": ACC_NORM}),
        "bundled_arc_challenge.yaml": ("arc_challenge", {
            "task": "bundled_arc_challenge", "custom_dataset": _function("arc"),
            "dataset_kwargs": {"sample": "arc_challenge"}, **ARC, "validation_split": "validation",
            "test_split": "test", "fewshot_split": "validation", "metric_list": ACC_NORM}),
        "bundled_openbookqa.yaml": ("openbookqa", {
            "task": "bundled_openbookqa", "custom_dataset": _function("openbookqa"), "output_type": "multiple_choice",
            "training_split": "train", "validation_split": "validation", "test_split": "test",
            "doc_to_text": "question_stem", "doc_to_target": "{{choices.label.index(answerKey.lstrip())}}",
            "doc_to_choice": "{{choices.text}}", "metric_list": ACC_NORM}),
        "bundled_boolq.yaml": ("boolq", {
            "task": "bundled_boolq", "custom_dataset": _function("boolq"), "output_type": "multiple_choice",
            "validation_split": "validation", "fewshot_split": "validation",
            "doc_to_text": "{{passage}}\nQuestion: {{question}}?\nAnswer:", "doc_to_target": "label",
            "doc_to_choice": ["no", "yes"], "metric_list": ACC}),
        "_bundled_mmlu_template_yaml": ("mmlu_abstract_algebra", {
            "custom_dataset": _function("mmlu"), "test_split": "validation", "fewshot_split": "dev",
            "fewshot_config": {"sampler": "first_n"}, "output_type": "multiple_choice",
            "doc_to_text": "{{question.strip()}}\nA. {{choices[0]}}\nB. {{choices[1]}}\nC. {{choices[2]}}\nD. "
                           "{{choices[3]}}\nAnswer:",
            "doc_to_choice": ["A", "B", "C", "D"], "doc_to_target": "answer", "metric_list": ACC}),
    }
    subjects = sorted(p.name.removesuffix("_val.csv") for p in (ROOT / "mmlu" / "val").glob("*_val.csv"))
    for subject in subjects:
        out[f"bundled_mmlu_{subject}.yaml"] = (f"mmlu_{subject}", {
            "include": "_bundled_mmlu_template_yaml", "task": f"bundled_mmlu_{subject}", "task_alias": subject,
            "dataset_kwargs": {"subject": subject},
            "description": f"The following are multiple choice questions (with answers) about "
                           f"{subject.replace('_', ' ')}.\n\n"})
    out["bundled_mmlu.yaml"] = ("mmlu", {
        "group": "bundled_mmlu", "task": [f"bundled_mmlu_{s}" for s in subjects],
        "aggregate_metric_list": [{"metric": "acc", "weight_by_size": True}]})
    return out


class _Dumper(yaml.SafeDumper):
    """Prompts with newlines written as lm-eval's YAMLs write them: one double-quoted line with \\n."""


_Dumper.add_representer(str, lambda d, s: d.represent_scalar("tag:yaml.org,2002:str", s, style='"' if "\n" in s else None))


def render(mirrors: str, config: dict) -> str:
    text = yaml.dump(config, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=1000)
    text = text.replace("'!function bundled.", "!function bundled.").replace("')\n", ")\n")
    text = "\n".join(line[:-1] if line.startswith("custom_dataset: !function") and line.endswith("'") else line
                     for line in text.splitlines()) + "\n"
    return HEADER.format(mirrors=mirrors) + text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="verify instead of writing")
    args = parser.parse_args(argv)
    stale = []
    for name, (mirrors, config) in tasks().items():
        text, path = render(mirrors, config), OUT / name
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print(f"{len(stale)} files differ from what the script writes: {', '.join(stale[:5])}", file=sys.stderr)
        return 1
    print(f"{'checked' if args.check else 'wrote'} {len(tasks())} files in {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
