"""The teacher's concentrated knowledge: its top-k tokens and log-probabilities at every position.

FIRST (REFERENCE.md §2, step 2) keeps only the teacher's top-k (k = 5) tokens per position
instead of the full distribution: top-5 holds most of the mass while costing 20 bytes a position
instead of vocabulary × 2 (≈ 98 kB for a 49k vocabulary). As the well-kept tools do (DistillKit,
axolotl KD) we store integer ids and log-probabilities under the full-vocabulary log_softmax in
fp32, so re-calibration and the tail bucket ``log1p(-Σ p)`` can be computed later.

Alignment contract: **row j of a sequence is the teacher's distribution over token j+1, given
tokens 0..j**; a sequence of T tokens has T rows, the last predicting the token after it.

Layout of ``out_dir``::

    manifest.json                 settings, shard list (sequence ranges, sha256), coverage, storage
    shard-00000.safetensors       sequences [0, shard_size)
    shard-00001.safetensors       ...

A shard holds ``ids`` (R, k) uint16/uint32, ``logprobs`` (R, k) float16/float32 and ``offsets``
(n + 1,) int64: its n sequences' rows concatenated, sequence i in rows offsets[i]:offsets[i+1];
plus its coverage sums so that a resumed run can report coverage over every shard. Shards and
manifest are written atomically (temporary file + ``os.replace``); the manifest is rewritten
after each shard, so an interrupted run resumes from its last complete shard.

Under a multi-process launch rank r extracts shards r, r + N, r + 2N, … and keeps its own partial
manifest (``manifest-rank<r>.json``) after each; once every rank is done, rank 0 merges them into
the one ``manifest.json`` a reader sees — the same store, shard for shard, as one process makes.
"""
from __future__ import annotations

import hashlib
import json
from bisect import bisect_right
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch
from safetensors.numpy import load as st_load, save as st_save

from lab.core.files import write_atomic
from lab.core.layout import MANIFEST_FILE as MANIFEST, TOPK_SHARD_SIZE
from lab.models import distributed
from lab.models.batching import index_device, plan_batches, right_padded
from lab.models.loading import input_device

FORMAT = "calibration-lab/topk-store/v1"
ALIGNMENT = ("row j of sequence i is the teacher's distribution over token j+1 of sequence i, given "
             "tokens 0..j; a sequence of T tokens has T rows, the last predicting the token after it")
LOGPROBS = "log_softmax over the full vocabulary, computed in fp32"
LOGPROB_DTYPES = {"float16": np.float16, "float32": np.float32}
FULL_FP16_BYTES = 2  # per vocabulary entry: the full distribution FIRST compares top-k storage with


class StoreError(ValueError):
    """A top-k store that cannot be written or read as asked; the message says what to do."""


def id_dtype_for(vocab_size: int) -> np.dtype:
    """The smallest unsigned integer type that holds every token id below ``vocab_size``."""
    if vocab_size < 1:
        raise StoreError(f"Expected a vocabulary size larger than 0, but got {vocab_size}")
    return np.dtype(np.uint16 if vocab_size <= 65535 else np.uint32)


class _Coverage:
    """Running sum / min / max over positions of the top-K cumulative probability, K = 1..n."""

    def __init__(self, n: int) -> None:
        self.sum = np.zeros(n, np.float64)
        self.min = np.full(n, np.inf)
        self.max = np.full(n, -np.inf)
        self.count = 0

    def add(self, total: np.ndarray, low: np.ndarray, high: np.ndarray, count: int) -> None:
        self.sum += total
        self.min = np.minimum(self.min, low)
        self.max = np.maximum(self.max, high)
        self.count += count

    def arrays(self) -> dict[str, np.ndarray]:
        return {"coverage_sum": self.sum, "coverage_min": self.min, "coverage_max": self.max}

    def summary(self) -> dict[str, list]:
        mean = self.sum / max(self.count, 1)
        return {"k": list(range(1, len(self.sum) + 1)), "mean": mean.round(6).tolist(),
                "min": self.min.round(6).tolist(), "max": self.max.round(6).tolist(), "positions": self.count}


def _fingerprint(sequences: Sequence[Sequence[int]], vocab_size: int) -> tuple[str, list[int]]:
    """:func:`sequences_sha256` (so a resumed run provably extends the same data) and the lengths,
    once every sequence is checked to be non-empty token ids in the teacher's vocabulary."""
    lengths = []
    for i, seq in enumerate(sequences):
        arr = np.asarray(seq, dtype=np.int64)
        if arr.ndim != 1 or arr.size == 0:
            raise StoreError(f"Expected sequence {i} to be a non-empty list of token ids, but got shape {arr.shape}")
        bad = arr[(arr < 0) | (arr >= vocab_size)]
        if bad.size:
            raise StoreError(f"Expected token ids in the teacher's vocabulary 0..{vocab_size - 1}, but sequence {i} "
                             f"holds {int(bad[0])}; was it tokenised with the teacher's tokenizer?")
        lengths.append(len(arr))
    return sequences_sha256(sequences), lengths


def sequences_sha256(sequences: Sequence[Sequence[int]]) -> str:
    """sha256 over each sequence's length and int64 token ids, in order: the manifest's
    ``sequences_sha256``. Equal hashes mean the same token ids position by position, which is what
    distilling from a store needs (row j of sequence i describes token j+1 of sequence i)."""
    digest = hashlib.sha256()
    for seq in sequences:
        arr = np.asarray(seq, dtype=np.int64)
        digest.update(len(arr).to_bytes(8, "little") + arr.tobytes())
    return digest.hexdigest()


def misalignment(manifest: dict, sequences: Sequence[Sequence[int]], tokenizer: str) -> Optional[str]:
    """Why a student cannot be distilled from the store of ``manifest`` on ``sequences`` (its own
    tokenisation of the training examples, by ``tokenizer``), or None when the token ids are the
    same. Equal counts are not enough: two tokenizers can give as many sequences (even as many
    tokens) and still put different tokens at each position, and the top-k KL would then compare
    unrelated distributions without any error."""
    stored = manifest["sequences_sha256"]
    mine = sequences_sha256(sequences)
    if mine == stored:
        return None
    rows = sum(len(s) for s in sequences)
    if len(sequences) != manifest["n_sequences"]:
        what = f"{manifest['n_sequences']} sequences there, {len(sequences)} here"
    elif rows != manifest["n_rows"]:
        what = f"the same {len(sequences)} sequences but {manifest['n_rows']} tokens there, {rows} here"
    else:
        what = f"the same {len(sequences)} sequences and {rows} tokens but different token ids"
    teacher = manifest.get("meta", {}).get("tokenizer") or "not recorded in this store"
    return (f"The teacher's top-k store does not describe the student's training sequences: {what} "
            f"(sequences_sha256 {stored[:12]}… there, {mine[:12]}… here). Teacher tokenizer: {teacher}; student "
            f"tokenizer: {tokenizer}. FIRST matches the two distributions token by token, so both must tokenise "
            "the data identically: pick a student that shares the teacher's tokenizer, or, if the data or "
            "template changed since extraction, delete the store to extract it again.")


def _rank_manifest(rank: int) -> str:
    return f"manifest-rank{rank}.json"


def rank_share(n_sequences: int, shard_size: int) -> int:
    """How many of ``n_sequences`` this rank extracts (all of them in one process)."""
    size, rank = distributed.world_size(), distributed.rank()
    return sum(min(n_sequences, (i + 1) * shard_size) - i * shard_size
               for i in range(rank, -(-n_sequences // shard_size), size))


def _read_manifest(out_dir: Path, name: str = MANIFEST) -> Optional[dict]:
    path = out_dir / name
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text())
    except ValueError as e:
        raise StoreError(f"{path} is not valid JSON ({e}); pick another out_dir or delete this one") from e
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise StoreError(f"{path} is not a {FORMAT} manifest; pick another out_dir")
    return manifest


def _load_shard(out_dir: Path, entry: dict) -> dict[str, np.ndarray]:
    """Read one shard, checking its sha256 against the manifest before trusting a byte of it."""
    path = out_dir / entry["file"]
    if not path.is_file():
        raise StoreError(f"Shard {path} listed in the manifest is missing; re-run extract_topk on {out_dir}")
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise StoreError(f"Shard {path} does not match its sha256 in the manifest (corrupted or modified); "
                         f"delete it and re-run extract_topk on {out_dir} to rebuild it")
    return st_load(data)


@torch.inference_mode()
def _topk_batch(model: torch.nn.Module, seqs: list[list[int]], pad_id: int, top: int, n_cov: int,
                vocab_size: int) -> tuple[torch.Tensor, torch.Tensor, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Top-``top`` ids and fp32 log-probs (R, top) at every real position, rows sequence by sequence,
    and the batch's coverage (sum, min, max) of the top-K mass for K = 1..n_cov."""
    device, index = input_device(model), index_device(model)
    n_rows = sum(len(s) for s in seqs)
    ids, attention = right_padded(seqs, pad_id)  # (B, T)
    ids, mask = ids.to(device), attention.bool().to(device)
    # A boolean logits_to_keep (where a dispatched model indexes) applies the LM head only at real positions: (R, V).
    logits = model(input_ids=ids, attention_mask=mask.long(), logits_to_keep=mask.to(index), use_cache=False).logits
    if logits.shape != (n_rows, vocab_size):
        raise StoreError(f"Expected the model to return logits of shape ({n_rows}, {vocab_size}) for a "
                         f"boolean logits_to_keep, but got {tuple(logits.shape)}; is config.vocab_size right?")
    # topk on the logits then subtract logsumexp: equal to topk(log_softmax) without writing a second (R, V).
    values, top_ids = logits.topk(top, dim=-1)  # (R, top)
    top_lp = values.float() - torch.logsumexp(logits.float(), dim=-1, keepdim=True)  # (R, top) fp32
    mass = top_lp[:, :n_cov].exp().cumsum(dim=-1)  # (R, n_cov): top-K cumulative probability
    coverage = (mass.sum(0, dtype=torch.float64).cpu().numpy(), mass.amin(0).double().cpu().numpy(),
                mass.amax(0).double().cpu().numpy())
    return top_ids, top_lp, coverage


def _extract_shard(model: torch.nn.Module, seqs: list[list[int]], *, k: int, top: int, n_cov: int, vocab_size: int,
                   batch_size: int, pad_id: int, id_dtype: np.dtype, lp_dtype: type,
                   progress: Optional[Callable[[int], None]],
                   should_stop: Optional[Callable[[], bool]]) -> Optional[dict[str, np.ndarray]]:
    """One shard's arrays, or None when ``should_stop`` asked to stop before the shard was done."""
    lengths = [len(s) for s in seqs]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)  # (n + 1,)
    ids = np.empty((offsets[-1], k), id_dtype)  # (R, k)
    logprobs = np.empty((offsets[-1], k), lp_dtype)  # (R, k)
    coverage = _Coverage(n_cov)
    for batch in plan_batches(lengths, batch_size):  # longest first: little padding; rows placed back by offset
        if should_stop is not None and should_stop():
            return None
        top_ids, top_lp, cov = _topk_batch(model, [seqs[i] for i in batch], pad_id, top, n_cov, vocab_size)
        coverage.add(*cov, count=top_ids.shape[0])
        batch_ids = top_ids[:, :k].cpu().numpy().astype(id_dtype)  # only (rows, k) leaves the device
        batch_lp = top_lp[:, :k].cpu().numpy().astype(lp_dtype)
        row = 0
        for i in batch:
            ids[offsets[i] : offsets[i + 1]] = batch_ids[row : row + lengths[i]]
            logprobs[offsets[i] : offsets[i + 1]] = batch_lp[row : row + lengths[i]]
            row += lengths[i]
        if progress is not None:
            progress(len(batch))
    return {"ids": ids, "logprobs": logprobs, "offsets": offsets, **coverage.arrays()}


def extract_topk(model: torch.nn.Module, sequences: Sequence[Sequence[int]], out_dir: Path, *, k: int = 5,
                 batch_size: int = 8, logprob_dtype: str = "float16", shard_size: int = TOPK_SHARD_SIZE, coverage_k: int = 100,
                 pad_id: int = 0, meta: Optional[dict] = None, progress: Optional[Callable[[int], None]] = None,
                 should_stop: Optional[Callable[[], bool]] = None) -> dict:
    """Run the teacher over ``sequences`` and store its top-``k`` ids and log-probs at every position.

    ``sequences``: token-id lists (e.g. prompt + answer), each giving len(seq) rows (see
    ``ALIGNMENT``). ``meta``: what to record about the run (``model``, ``dataset``, ``template``, …).
    ``progress(n)`` is advanced by the number of sequences finished (after each batch; once per
    shard skipped on resume). ``should_stop()`` is asked between batches; when it says True the
    shard in progress is dropped, the manifest is left consistent with ``complete: false``, and
    the call returns: calling again with the same arguments finishes the job. The top-K mass for
    K = 1..``coverage_k`` (FIRST's Figure 2) comes from the same forward passes. Returns the manifest.
    """
    out_dir = Path(out_dir)
    vocab_size = int(model.config.vocab_size)
    _check_extract_args(sequences, k=k, batch_size=batch_size, shard_size=shard_size, coverage_k=coverage_k,
                        logprob_dtype=logprob_dtype, pad_id=pad_id, vocab_size=vocab_size)
    fingerprint, lengths = _fingerprint(sequences, vocab_size)
    id_dtype, lp_dtype = id_dtype_for(vocab_size), LOGPROB_DTYPES[logprob_dtype]
    n_cov = min(coverage_k, vocab_size)
    settings = {
        "format": FORMAT, "k": k, "id_dtype": id_dtype.name, "logprob_dtype": logprob_dtype,
        "vocab_size": vocab_size, "coverage_k": n_cov, "shard_size": shard_size, "n_sequences": len(sequences),
        "sequences_sha256": fingerprint, "meta": json.loads(json.dumps(meta or {})),
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    shards, coverage = _resume(out_dir, settings)
    n_shards = -(-len(sequences) // shard_size)
    size, rank = distributed.world_size(), distributed.rank()
    # One process writes the manifest after each shard; a rank writes its own, merged at the end.
    progress_file = MANIFEST if size == 1 else _rank_manifest(rank)
    top = max(k, n_cov)
    was_training = model.training
    model.eval()  # dropout would make the stored knowledge noise (a freshly fine-tuned teacher is in train mode)
    try:
        for index in range(rank, n_shards, size):
            lo, hi = index * shard_size, min(len(sequences), (index + 1) * shard_size)
            if index in shards:
                if progress is not None:
                    progress(hi - lo)
                continue
            arrays = _extract_shard(model, [list(s) for s in sequences[lo:hi]], k=k, top=top, n_cov=n_cov,
                                    vocab_size=vocab_size, batch_size=batch_size, pad_id=pad_id, id_dtype=id_dtype,
                                    lp_dtype=lp_dtype, progress=progress, should_stop=should_stop)
            if arrays is None:
                break
            shards[index] = _write_shard(out_dir, index, lo, hi, arrays)
            coverage.add(arrays["coverage_sum"], arrays["coverage_min"], arrays["coverage_max"], shards[index]["rows"])
            _write_manifest(out_dir, settings, shards, n_shards, sum(lengths), coverage, id_dtype, lp_dtype,
                            progress_file)
    finally:
        model.train(was_training)
    if size == 1:
        return _write_manifest(out_dir, settings, shards, n_shards, sum(lengths), coverage, id_dtype, lp_dtype)
    distributed.barrier()  # every rank's shards are on disk
    if distributed.is_main():
        shards, coverage = _resume(out_dir, settings)
        _write_manifest(out_dir, settings, shards, n_shards, sum(lengths), coverage, id_dtype, lp_dtype)
        for r in range(size):
            (out_dir / _rank_manifest(r)).unlink(missing_ok=True)
    distributed.barrier()  # the merged manifest is written
    return _read_manifest(out_dir)


def _check_extract_args(sequences: Sequence[Sequence[int]], *, k: int, batch_size: int, shard_size: int,
                        coverage_k: int, logprob_dtype: str, pad_id: int, vocab_size: int) -> None:
    """Refuse bad arguments before the teacher runs or anything is written to ``out_dir``."""
    for name, value in [("k", k), ("batch_size", batch_size), ("shard_size", shard_size), ("coverage_k", coverage_k)]:
        if not isinstance(value, int) or value < 1:
            raise StoreError(f"Expected `{name}` to be an integer larger than 0, but got {value!r}")
    if k > vocab_size:
        raise StoreError(f"Expected `k` to be at most the vocabulary size {vocab_size}, but got {k}")
    if logprob_dtype not in LOGPROB_DTYPES:
        raise StoreError(f"Expected `logprob_dtype` to be one of {sorted(LOGPROB_DTYPES)}, but got {logprob_dtype!r}")
    if not 0 <= pad_id < vocab_size:
        raise StoreError(f"Expected `pad_id` in 0..{vocab_size - 1}, but got {pad_id}")
    if not sequences:
        raise StoreError("Expected at least one sequence to extract, but got none")


def _resume(out_dir: Path, settings: dict) -> tuple[dict[int, dict], _Coverage]:
    """The complete shards an earlier run left in ``out_dir`` and their coverage, so that calling
    again finishes the job rather than starting over. A store made with other settings is refused
    (its shards would mix two teachers or two datasets); a shard that is missing or fails its
    sha256 is left out, to be extracted again. The ranks' partial manifests of a multi-process run
    count too: their shards are as complete as the merged manifest's."""
    manifests = [_read_manifest(out_dir), *(_read_manifest(out_dir, p.name) for p in out_dir.glob(_rank_manifest("*")))]
    entries: dict[int, dict] = {}
    for previous in filter(None, manifests):
        changed = [f"{key}: {previous.get(key)!r} there, {value!r} here" for key, value in settings.items()
                   if previous.get(key) != value]
        if changed:
            raise StoreError(f"{out_dir} holds a top-k store made with different settings ({'; '.join(changed)}). "
                             "Pick another out_dir, or delete this one to start over.")
        entries.update((entry["index"], entry) for entry in previous.get("shards", []))
    coverage = _Coverage(settings["coverage_k"])
    shards: dict[int, dict] = {}
    for entry in entries.values():
        try:
            arrays = _load_shard(out_dir, entry)
        except StoreError:
            continue  # missing or corrupted: extract it again
        coverage.add(arrays["coverage_sum"], arrays["coverage_min"], arrays["coverage_max"], int(arrays["offsets"][-1]))
        shards[entry["index"]] = entry
    return shards, coverage


def _write_shard(out_dir: Path, index: int, lo: int, hi: int, arrays: dict[str, np.ndarray]) -> dict:
    """Write shard ``index`` (sequences ``lo:hi``) atomically; returns its manifest entry, whose
    sha256 lets a reader or a resumed run trust the file."""
    name = f"shard-{index:05d}.safetensors"
    # One metadata key: safetensors orders several at random, and equal shards should hash equal.
    data = st_save(arrays, metadata={FORMAT: json.dumps({"alignment": ALIGNMENT, "sequences": [lo, hi]})})
    write_atomic(out_dir / name, data)
    return {"index": index, "file": name, "sequences": [lo, hi], "rows": int(arrays["offsets"][-1]),
            "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _write_manifest(out_dir: Path, settings: dict, shards: dict[int, dict], n_shards: int, n_rows: int,
                    coverage: _Coverage, id_dtype: np.dtype, lp_dtype: type, name: str = MANIFEST) -> dict:
    """Everything a reader (or Figure 2) needs, rewritten atomically after every shard."""
    meta = settings["meta"]
    per_position = id_dtype.itemsize + np.dtype(lp_dtype).itemsize  # bytes per stored (id, logprob) pair
    ks = list(range(1, settings["coverage_k"] + 1))
    full = settings["vocab_size"] * FULL_FP16_BYTES
    manifest: dict[str, Any] = {
        **settings, "model": meta.get("model"), "dataset": meta.get("dataset"), "template": meta.get("template"),
        "alignment": ALIGNMENT, "logprobs": LOGPROBS,
        "complete": len(shards) == n_shards, "n_rows": n_rows, "n_shards": n_shards,
        "shards": [shards[i] for i in sorted(shards)],
        "bytes_on_disk": sum(e["bytes"] for e in shards.values()),
        "coverage": coverage.summary(),
        "storage": {"k": ks, "bytes_per_position": [K * per_position for K in ks],
                    "total_bytes": [K * per_position * n_rows for K in ks],
                    "full_fp16_bytes_per_position": full, "full_fp16_total_bytes": full * n_rows},
    }
    write_atomic(out_dir / name, json.dumps(manifest, indent=1).encode())
    return manifest


class TopKStore:
    """Read a finished store: ``store[i]`` → ids (T_i, k) int64 and log-probs (T_i, k) float32.

    Row j describes token j+1 of sequence i (see ``ALIGNMENT``). Each shard's sha256 is checked
    when it is first read; ``verify()`` checks them all now. The last ``cache_shards`` shards read
    stay in memory (a shard of top-5 is ~20 bytes × its positions).
    """

    def __init__(self, out_dir: Path, cache_shards: int = 4) -> None:
        self.out_dir = Path(out_dir)
        manifest = _read_manifest(self.out_dir)
        if manifest is None:
            raise StoreError(f"No {MANIFEST} in {self.out_dir}; run extract_topk there first")
        if not manifest["complete"]:
            raise StoreError(f"The store in {self.out_dir} is incomplete ({len(manifest['shards'])} of "
                             f"{manifest['n_shards']} shards); call extract_topk again with the same arguments")
        self.manifest = manifest
        self._starts = [e["sequences"][0] for e in manifest["shards"]]
        self._cache: OrderedDict[int, dict[str, np.ndarray]] = OrderedDict()
        self._cache_shards = max(cache_shards, 1)

    def __len__(self) -> int:
        return self.manifest["n_sequences"]

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        if not -len(self) <= i < len(self):
            raise IndexError(f"Expected a sequence index in 0..{len(self) - 1}, but got {i}")
        i %= len(self)
        s = bisect_right(self._starts, i) - 1
        shard = self._shard(s)
        a, b = shard["offsets"][i - self._starts[s] : i - self._starts[s] + 2]
        return shard["ids"][a:b].astype(np.int64), shard["logprobs"][a:b].astype(np.float32)

    def verify(self) -> None:
        """Check every shard against its sha256 now; raises StoreError naming the first bad one."""
        for entry in self.manifest["shards"]:
            _load_shard(self.out_dir, entry)

    def _shard(self, s: int) -> dict[str, np.ndarray]:
        if s in self._cache:
            self._cache.move_to_end(s)
        else:
            self._cache[s] = _load_shard(self.out_dir, self.manifest["shards"][s])
            if len(self._cache) > self._cache_shards:
                self._cache.popitem(last=False)
        return self._cache[s]


# (sequence index, its ids (T, k), its log-probs (T, k)) → the replacement rows, same shapes
RowEdit = Callable[[int, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


def derive_store(source_dir: Path, out_dir: Path, edit: RowEdit, meta: dict) -> dict:
    """A store over the same sequences as ``source_dir``'s with each sequence's rows replaced by
    ``edit``'s: e.g. the answer positions set to a known true distribution (an oracle teacher).
    Same alignment, k, dtypes and shard ranges, so every reader and the students' misalignment
    check take it as they take an extracted one; ``meta`` (with the source's folder) replaces the
    source's. The coverage figures stay the source teacher's. Returns the manifest."""
    source = TopKStore(source_dir)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    settings = {key: source.manifest[key] for key in ("format", "k", "id_dtype", "logprob_dtype", "vocab_size",
                                                      "coverage_k", "shard_size", "n_sequences", "sequences_sha256")}
    settings["meta"] = json.loads(json.dumps({**meta, "derived_from": str(source_dir)}))
    id_dtype, lp_dtype = np.dtype(settings["id_dtype"]), LOGPROB_DTYPES[settings["logprob_dtype"]]
    coverage, shards = _Coverage(settings["coverage_k"]), {}
    for entry in source.manifest["shards"]:
        arrays = dict(_load_shard(source.out_dir, entry))
        lo, hi = entry["sequences"]
        offsets = arrays["offsets"]
        for i in range(hi - lo):
            a, b = offsets[i], offsets[i + 1]
            ids, logprobs = edit(lo + i, arrays["ids"][a:b].astype(np.int64), arrays["logprobs"][a:b].astype(np.float32))
            if ids.shape != (b - a, settings["k"]) or logprobs.shape != ids.shape:
                raise StoreError(f"derive_store: the edit of sequence {lo + i} returned shapes {ids.shape} and "
                                 f"{logprobs.shape}, expected {(b - a, settings['k'])}")
            arrays["ids"][a:b], arrays["logprobs"][a:b] = ids.astype(id_dtype), logprobs.astype(lp_dtype)
        shards[entry["index"]] = _write_shard(out_dir, entry["index"], lo, hi, arrays)
        coverage.add(arrays["coverage_sum"], arrays["coverage_min"], arrays["coverage_max"], entry["rows"])
    return _write_manifest(out_dir, settings, shards, source.manifest["n_shards"], source.manifest["n_rows"],
                           coverage, id_dtype, lp_dtype)
