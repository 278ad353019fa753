"""Top-k extraction: every stored row against an independent unpadded forward pass of the teacher."""
import hashlib
import json

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from lab.kinds.extract.store import (ALIGNMENT, StoreError, TopKStore, extract_topk, id_dtype_for, misalignment,
                                     sequences_sha256)
from tests.helpers import VOCAB, tiny_llama

pytestmark = pytest.mark.model

LENGTHS = [7, 3, 12, 1, 5]


@pytest.fixture(scope="module")
def model():
    return tiny_llama()


@pytest.fixture(scope="module")
def seqs():
    rng = np.random.default_rng(0)
    return [rng.integers(1, VOCAB, n).tolist() for n in LENGTHS]


def reference(model, seq, k=5):
    """topk(log_softmax) of the model's own forward on the unpadded sequence: (T, k) each."""
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([seq])).logits[0].float()  # (T, V)
    lp, ids = torch.log_softmax(logits, -1).topk(k, -1)
    return ids.numpy(), lp.numpy()


def test_rows_match_an_unpadded_forward_whatever_the_batch_size(model, seqs, tmp_path):
    stores = {}
    for bs in (1, 4):
        extract_topk(model, seqs, tmp_path / f"bs{bs}", batch_size=bs, meta={"model": "tiny"})
        stores[bs] = TopKStore(tmp_path / f"bs{bs}")
    assert len(stores[4]) == len(seqs)
    for i, seq in enumerate(seqs):
        ref_ids, ref_lp = reference(model, seq)
        for store in stores.values():
            ids, lp = store[i]
            assert ids.shape == lp.shape == (len(seq), 5) and ids.dtype == np.int64 and lp.dtype == np.float32
            np.testing.assert_array_equal(ids, ref_ids)
            np.testing.assert_allclose(lp, ref_lp, rtol=1e-3, atol=1e-3)  # stored as float16


def test_row_j_is_the_distribution_of_token_j_plus_1(model, seqs, tmp_path):
    manifest = extract_topk(model, seqs, tmp_path, k=4, logprob_dtype="float32")
    assert manifest["alignment"] == ALIGNMENT and "token j+1" in ALIGNMENT
    seq = seqs[0]
    ids, lp = TopKStore(tmp_path)[0]
    for j in range(len(seq)):  # the prefix 0..j's last position predicts token j+1
        with torch.inference_mode():
            last = torch.log_softmax(model(input_ids=torch.tensor([seq[: j + 1]])).logits[0, -1].float(), -1)
        ref_lp, ref_ids = last.topk(4)
        np.testing.assert_array_equal(ids[j], ref_ids.numpy())
        np.testing.assert_allclose(lp[j], ref_lp.numpy(), rtol=1e-5, atol=1e-5)


def test_dropout_is_off_during_extraction_and_the_mode_is_restored(seqs, tmp_path):
    noisy = tiny_llama(attention_dropout=0.5).train()
    extract_topk(noisy, seqs[:2], tmp_path)
    assert noisy.training
    ids, _ = TopKStore(tmp_path)[0]
    np.testing.assert_array_equal(ids, reference(noisy.eval(), seqs[0])[0])


def test_id_and_logprob_dtypes(model, seqs, tmp_path):
    assert id_dtype_for(300) == np.uint16 and id_dtype_for(49152) == np.uint16 and id_dtype_for(65535) == np.uint16
    assert id_dtype_for(65536) == np.uint32 and id_dtype_for(70000) == np.uint32
    for dtype in ("float16", "float32"):
        manifest = extract_topk(model, seqs, tmp_path / dtype, logprob_dtype=dtype)
        shard = load_file(str(tmp_path / dtype / manifest["shards"][0]["file"]))
        assert shard["ids"].dtype == np.uint16 and shard["logprobs"].dtype == np.dtype(dtype)
        assert (manifest["id_dtype"], manifest["logprob_dtype"]) == ("uint16", dtype)
        assert shard["offsets"].tolist() == np.concatenate([[0], np.cumsum(LENGTHS)]).tolist()
    with pytest.raises(StoreError, match="logprob_dtype"):
        extract_topk(model, seqs, tmp_path / "bad", logprob_dtype="bfloat16")
    with pytest.raises(StoreError, match="vocabulary"):
        extract_topk(model, [[1, VOCAB]], tmp_path / "bad")


def test_shards_checksums_and_verify(model, seqs, tmp_path):
    manifest = extract_topk(model, seqs, tmp_path, shard_size=2)
    assert [e["sequences"] for e in manifest["shards"]] == [[0, 2], [2, 4], [4, 5]]
    assert manifest["complete"] and manifest["n_sequences"] == 5 and manifest["n_rows"] == sum(LENGTHS)
    for entry in manifest["shards"]:
        data = (tmp_path / entry["file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"] and len(data) == entry["bytes"]
    assert manifest["bytes_on_disk"] == sum(e["bytes"] for e in manifest["shards"])
    assert json.loads((tmp_path / "manifest.json").read_text()) == manifest
    TopKStore(tmp_path).verify()
    path = tmp_path / manifest["shards"][1]["file"]
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(bytes(data))
    store = TopKStore(tmp_path)
    store[0]  # shard 0 is intact: read lazily, fine
    with pytest.raises(StoreError, match="sha256"):
        store[3]
    with pytest.raises(StoreError, match="sha256"):
        store.verify()


def test_interrupted_run_resumes_to_the_same_store(model, seqs, tmp_path):
    whole = extract_topk(model, seqs, tmp_path / "whole", shard_size=2, batch_size=2)
    done = []
    part = extract_topk(model, seqs, tmp_path / "resumed", shard_size=2, batch_size=2,
                        progress=done.append, should_stop=lambda: sum(done) >= 2)
    assert not part["complete"] and [e["sequences"] for e in part["shards"]] == [[0, 2]]
    with pytest.raises(StoreError, match="incomplete"):
        TopKStore(tmp_path / "resumed")
    done.clear()
    resumed = extract_topk(model, seqs, tmp_path / "resumed", shard_size=2, batch_size=2, progress=done.append)
    assert resumed["complete"] and sum(done) == len(seqs)
    assert [e["sha256"] for e in resumed["shards"]] == [e["sha256"] for e in whole["shards"]]
    assert resumed["coverage"] == whole["coverage"]
    with pytest.raises(StoreError, match="different settings.*k: 5 there, 3 here"):
        extract_topk(model, seqs, tmp_path / "resumed", shard_size=2, batch_size=2, k=3)
    with pytest.raises(StoreError, match="sequences_sha256"):
        extract_topk(model, seqs[::-1], tmp_path / "resumed", shard_size=2, batch_size=2)


def test_sequences_sha256_is_the_manifests(model, seqs, tmp_path):
    manifest = extract_topk(model, seqs, tmp_path)
    digest = hashlib.sha256()
    for seq in seqs:  # by hand: each sequence's length (8 bytes, little-endian), then its int64 ids
        digest.update(len(seq).to_bytes(8, "little") + np.asarray(seq, dtype="<i8").tobytes())
    assert manifest["sequences_sha256"] == sequences_sha256(seqs) == digest.hexdigest()
    assert sequences_sha256([[1, 2], [3]]) != sequences_sha256([[1], [2, 3]])  # lengths count, not just ids


def test_misalignment_caught_by_hash_when_counts_and_lengths_agree(model, seqs, tmp_path):
    """Another tokenizer can give as many sequences and tokens as the teacher's and still put other
    ids at each position: the count check alone let this through."""
    manifest = extract_topk(model, seqs, tmp_path, meta={"tokenizer": "teacher-tok (LlamaTokenizerFast, 300 tokens)"})
    assert misalignment(manifest, [list(s) for s in seqs], "student-tok") is None
    other = [[(t % (VOCAB - 1)) + 1 for t in s] for s in seqs]  # same lengths, shifted ids
    assert [len(s) for s in other] == LENGTHS and other != seqs
    problem = misalignment(manifest, other, "student-tok (GPT2TokenizerFast, 300 tokens)")
    assert f"the same {len(seqs)} sequences and {sum(LENGTHS)} tokens but different token ids" in problem
    assert "Teacher tokenizer: teacher-tok (LlamaTokenizerFast" in problem
    assert "student tokenizer: student-tok (GPT2TokenizerFast" in problem
    assert manifest["sequences_sha256"][:12] in problem and sequences_sha256(other)[:12] in problem
    assert "pick a student that shares the teacher's tokenizer" in problem
    assert "5 sequences there, 4 here" in misalignment(manifest, seqs[:4], "student-tok")
    longer = [s + [1] for s in seqs]
    assert f"{sum(LENGTHS)} tokens there, {sum(LENGTHS) + len(seqs)} here" in misalignment(manifest, longer, "s")
    unrecorded = extract_topk(model, seqs, tmp_path / "old")  # a store made before meta held the tokenizer
    assert "Teacher tokenizer: not recorded in this store" in misalignment(unrecorded, other, "s")


def test_coverage_and_storage_statistics(model, seqs, tmp_path):
    manifest = extract_topk(model, seqs, tmp_path, coverage_k=1000)  # more than the vocabulary: capped
    cov = manifest["coverage"]
    assert cov["k"] == list(range(1, VOCAB + 1)) and cov["positions"] == sum(LENGTHS)
    for key in ("mean", "min", "max"):
        values = np.array(cov[key])
        assert np.all(np.diff(values) >= -1e-6) and np.all(values <= 1 + 1e-5) and values[0] > 0
        assert values[-1] == pytest.approx(1, abs=1e-5)  # top-V is the whole distribution
    assert np.all(np.array(cov["min"]) <= np.array(cov["mean"]) + 1e-9)
    assert np.all(np.array(cov["mean"]) <= np.array(cov["max"]) + 1e-9)
    storage = manifest["storage"]
    assert storage["bytes_per_position"][4] == 5 * (2 + 2) and storage["k"][4] == 5
    assert storage["total_bytes"][4] == 20 * sum(LENGTHS)
    assert storage["full_fp16_bytes_per_position"] == VOCAB * 2


def test_bundled_model_smoke(bundled, tmp_path):
    texts = ["Q: Where is milk kept? A: The answer is (b).", "Paris is in France."]
    seqs = bundled.tokenizer(texts)["input_ids"]
    manifest = extract_topk(bundled.model, seqs, tmp_path, batch_size=2, coverage_k=10,
                            pad_id=bundled.tokenizer.pad_token_id, meta={"model": "bundled"})
    assert manifest["id_dtype"] == "uint16" and manifest["model"] == "bundled"
    store = TopKStore(tmp_path)
    for i, seq in enumerate(seqs):
        ids, lp = store[i]
        assert ids.shape == (len(seq), 5) and np.all(lp[:, 0] <= 0) and np.all(np.diff(lp, axis=1) <= 0)
    assert 0 < manifest["coverage"]["mean"][4] < 1


@pytest.mark.e2e
def test_the_extract_job_writes_a_store_with_its_coverage_curve(tiny_model_dir, csqa_files, tmp_path):
    import yaml

    from lab.jobkit.worker import run

    config = tmp_path / "extract.yaml"
    config.write_text(yaml.safe_dump({"kind": "extract", "model": str(tiny_model_dir), "dataset": "csqa",
                                      "data_files": csqa_files, "split": "train", "limit": 4, "k": 3}))
    assert run(config, tmp_path / "run") == 0
    manifest = json.loads((tmp_path / "run" / "topk" / "manifest.json").read_text())
    assert manifest["k"] == 3 and manifest["n_sequences"] == 4 and manifest["complete"]
    assert len(manifest["coverage"]["mean"]) == manifest["coverage_k"]
    assert manifest["meta"]["tokenizer"].startswith(f"{tiny_model_dir} (")  # whose tokenizer made the sequences
    assert json.loads((tmp_path / "run" / "result.json").read_text())["status"] == "succeeded"
