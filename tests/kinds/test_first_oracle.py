"""FIRST's oracle student: a store derived from the teacher's with the true answer distribution at
the answer positions, and the student distilled from it."""
from __future__ import annotations

import json

import numpy as np
import pytest

from lab.core.events import EventWriter
from lab.data import DataError
from lab.kinds.extract.store import TopKStore, derive_store, extract_topk, misalignment
from lab.kinds.first.config import FirstConfig
from lab.kinds.first.oracle import FLOOR, oracle_rows
from lab.kinds.first.run import run_first
from tests.helpers import VOCAB, tiny_llama


@pytest.mark.unit
def test_the_answer_row_holds_the_truth_most_likely_first_and_nothing_else_changes():
    ids = np.array([[9, 8, 7, 6, 5], [1, 20, 2, 3, 4], [5, 6, 7, 8, 9]])
    logprobs = np.log(np.full((3, 5), 0.1))
    out_ids, out_lp = oracle_rows(ids, logprobs, answer_pos=1, option_ids=[1, 2, 3, 4], truth=[0.1, 0.6, 0.2, 0.1])
    np.testing.assert_array_equal(out_ids[1], [2, 3, 1, 4, 20])  # by probability, ties in option order
    np.testing.assert_allclose(np.exp(out_lp[1, :4]), [0.6, 0.2, 0.1, 0.1])
    assert out_lp[1, 4] == FLOOR
    np.testing.assert_array_equal(out_ids[[0, 2]], ids[[0, 2]])
    np.testing.assert_array_equal(out_lp[[0, 2]], logprobs[[0, 2]])
    assert ids[1, 1] == 20  # the input is not modified


@pytest.mark.model
def test_a_derived_store_keeps_the_sequences_and_changes_only_what_the_edit_says(tmp_path):
    rng = np.random.default_rng(0)
    seqs = [rng.integers(1, VOCAB, n).tolist() for n in (4, 6, 3)]
    extract_topk(tiny_llama(), seqs, tmp_path / "teacher", shard_size=2, meta={"model": "tiny"})

    def edit(i, ids, logprobs):
        logprobs = logprobs.copy()
        logprobs[-1] = np.log([0.5, 0.2, 0.1, 0.1, 0.1])
        return ids, logprobs

    manifest = derive_store(tmp_path / "teacher", tmp_path / "oracle", edit, {"model": "oracle"})
    source, derived = TopKStore(tmp_path / "teacher"), TopKStore(tmp_path / "oracle")
    derived.verify()  # every shard's sha256 is its own
    assert manifest["n_shards"] == 2 and manifest["meta"]["derived_from"] == str(tmp_path / "teacher")
    assert misalignment(manifest, seqs, manifest["meta"].get("tokenizer", "")) is None
    for i in range(len(seqs)):
        (s_ids, s_lp), (d_ids, d_lp) = source[i], derived[i]
        np.testing.assert_array_equal(s_ids, d_ids)
        np.testing.assert_array_equal(s_lp[:-1], d_lp[:-1])
        np.testing.assert_allclose(np.exp(d_lp[-1]), [0.5, 0.2, 0.1, 0.1, 0.1], rtol=1e-3)


@pytest.fixture(scope="module")
def scratch(tiny_model_dir):
    """The tiny model made by lab.models.scratch (conftest), by the path a config names it."""
    return str(tiny_model_dir)


@pytest.mark.model
def test_the_oracle_student_learns_from_the_true_distribution(scratch, tmp_path):
    cfg = FirstConfig(teacher=scratch, finetune_teacher=False, student=scratch, dataset="synthetic",
                      data_files=["bundled"], students=["oracle"], train_limit=12, val_limit=6, test_limit=8,
                      training={"epochs": 1, "batch_size": 4, "learning_rate": 1e-3}, bootstrap=0,
                      ood=[{"dataset": "synthetic", "data_files": ["bundled"], "split": "shifted", "limit": 8}])
    report = run_first(cfg, tmp_path, EventWriter(tmp_path / "events.jsonl"), lambda: False)
    # The shifted split of the same dataset is a set of its own, evaluated and reported apart.
    assert [(r["method"], r["set"], r["split"], r["in_domain"]) for r in report["rows"]] == [
        ("teacher", "synthetic", "test", True), ("teacher", "synthetic/shifted", "shifted", False),
        ("oracle", "synthetic", "test", True), ("oracle", "synthetic/shifted", "shifted", False)]
    assert {p.name for p in (tmp_path / "eval").iterdir()} == {"teacher-synthetic", "teacher-synthetic-shifted",
                                                              "oracle-synthetic", "oracle-synthetic-shifted"}
    store = TopKStore(tmp_path / "topk_oracle" / "train")
    manifest = json.loads((tmp_path / "topk" / "train" / "manifest.json").read_text())
    assert store.manifest["sequences_sha256"] == manifest["sequences_sha256"]
    from lab.data import load
    from lab.models.tokenizers import load_tokenizer
    from lab.training.data import build_examples

    records = load("synthetic", "train", ["bundled"], limit=12).records
    examples = build_examples(records, cfg.template, load_tokenizer(scratch, scratch), True, 512)
    for i, example in enumerate(examples):
        ids, logprobs = store[i]
        truth = records[example["record"]].meta["true_probs"]
        answer = ids[example["answer_pos"]], np.exp(logprobs[example["answer_pos"]])
        assert sorted(answer[0][:4].tolist()) == sorted(example["option_ids"])
        np.testing.assert_allclose([answer[1][list(answer[0]).index(o)] for o in example["option_ids"]], truth,
                                   rtol=1e-3)
    md = (tmp_path / "report.md").read_text()
    assert "Oracle distill" in md and "synthetic/shifted (out-of-domain, n=8)" in md


@pytest.mark.model
def test_the_oracle_student_is_refused_on_questions_without_a_true_distribution(scratch, tmp_path):
    cfg = FirstConfig(teacher=scratch, student=scratch, dataset="obqa", data_files=["bundled"],
                      students=["finetune", "oracle"], train_limit=4)
    with pytest.raises(DataError, match="true answer distribution.*4 of 4 have none"):
        run_first(cfg, tmp_path, EventWriter(tmp_path / "events.jsonl"), lambda: False)
    assert not (tmp_path / "teacher").exists()  # refused before any training
