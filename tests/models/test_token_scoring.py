"""Token-level scoring (clm, facts): a closed-form model, a naive per-position reference, and the targets
checked against the text by decoding, independently of the offsets that placed them."""
import numpy as np
import pytest
import torch

from lab.core.errors import DataError, ScoringError
from lab.models.token_scoring import score_documents
from lab.models.token_targets import NO_SPAN, TokenDoc, clm_positions, encode, facts_positions, with_bos
from tests.helpers import table_model

TOL = 1e-5
PREFIX = "Finish this Wikipedia description: "  # the paper's Table 1 prompt for facts


# ---------------------------------------------------------------- a model computed by hand


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


@pytest.mark.model
def test_closed_form_model_gives_the_softmax_of_its_table():
    rng = np.random.default_rng(0)
    v = 16
    table = rng.normal(scale=2.0, size=(v, v))
    model = table_model(table)
    docs = [TokenDoc(rng.integers(0, v, size=n).tolist(), positions)
            for n, positions in [(12, [1, 5, 11]), (7, [3]), (30, [2, 29, 17, 17])]]
    results = score_documents(model, docs, pad_id=0, batch_size=2, top_k=4)
    for doc, rows in zip(docs, results):
        assert [r["position"] for r in rows] == doc.positions  # the caller's order, duplicates kept
        for r in rows:
            p = r["position"]
            probs = _softmax(table[doc.ids[p - 1]])  # by hand: the row of the previous token
            order = np.argsort(-probs)[:4]
            assert r["target_id"] == doc.ids[p] and r["entity"] is None and r["problem"] is None
            assert r["pred_id"] == int(order[0]) == r["top_ids"][0]
            assert r["top_ids"] == order.tolist()
            assert r["confidence"] == pytest.approx(probs.max(), abs=TOL)
            assert r["target_prob"] == pytest.approx(probs[doc.ids[p]], abs=TOL)
            assert r["top_probs"] == pytest.approx(probs[order].tolist(), abs=TOL)
            assert r["rest"] == pytest.approx(1 - probs[order].sum(), abs=TOL)
    # A temperature divides the logits before the softmax over the whole vocabulary.
    for doc, rows in zip(docs, score_documents(model, docs, pad_id=0, top_k=4, temperature=2.5)):
        for r in rows:
            probs = _softmax(table[doc.ids[r["position"] - 1]] / 2.5)
            assert r["confidence"] == pytest.approx(probs.max(), abs=TOL)
            assert r["target_prob"] == pytest.approx(probs[doc.ids[r["position"]]], abs=TOL)


# ---------------------------------------------------------------- a real (tiny) model against a naive reference


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    from lab.models.loading import load_model

    return load_model(str(tiny_model_dir), device="cpu")


def _naive(model, ids: list[int], p: int) -> np.ndarray:
    """One unpadded full forward over ids[:p]: the full-vocabulary distribution of the token at p."""
    with torch.no_grad():
        return torch.softmax(model(torch.tensor([ids[:p]])).logits[0, -1].double(), dim=-1).numpy()


def _tiny_docs(tokenizer) -> list[TokenDoc]:
    texts = ["The sky is blue because of Rayleigh scattering of sunlight.",
             "Paris is the capital of France.",
             "Water boils at one hundred degrees at sea level, and freezes at zero; " * 3]
    rng = np.random.default_rng(1)
    docs = []
    for text in texts:
        ids, _ = encode(tokenizer, text)
        docs.append(TokenDoc(ids, clm_positions(len(ids), 4, 2, rng)))
    return docs


def _same(a: list[list[dict]], b: list[list[dict]], tol: float) -> None:
    for rows_a, rows_b in zip(a, b, strict=True):
        for x, y in zip(rows_a, rows_b, strict=True):
            assert (x["position"], x["target_id"], x["top_ids"]) == (y["position"], y["target_id"], y["top_ids"])
            assert [x["confidence"], x["target_prob"], *x["top_probs"]] == pytest.approx(
                [y["confidence"], y["target_prob"], *y["top_probs"]], abs=tol)


@pytest.mark.model
def test_matches_a_naive_forward_per_position_batched_or_not(tiny):
    docs = _tiny_docs(tiny.tokenizer)
    batched = score_documents(tiny.model, docs, pad_id=0, batch_size=8)
    for doc, rows in zip(docs, batched):
        for r in rows:
            probs = _naive(tiny.model, doc.ids, r["position"])
            order = np.argsort(-probs)[:5]
            assert r["pred_id"] == int(order[0]) and r["top_ids"] == order.tolist()
            assert r["confidence"] == pytest.approx(probs.max(), abs=TOL)
            assert r["target_prob"] == pytest.approx(probs[doc.ids[r["position"]]], abs=TOL)
            assert r["top_probs"] == pytest.approx(probs[order].tolist(), abs=TOL)
    one_at_a_time = [score_documents(tiny.model, [doc], pad_id=0, batch_size=1)[0] for doc in docs]
    _same(batched, one_at_a_time, 1e-6)


@pytest.mark.model
def test_padding_changes_nothing(tiny):
    docs = _tiny_docs(tiny.tokenizer)
    short = docs[1]
    alone = score_documents(tiny.model, [short], pad_id=0)
    # Beside the longest document, the short one is padded by dozens of tokens; with another pad id too.
    for pad_id in (0, 7, 599):
        _same(score_documents(tiny.model, [docs[2], short], pad_id=pad_id, batch_size=2)[1:], alone, 1e-6)


@pytest.mark.model
def test_results_come_back_in_input_order_with_progress(tiny):
    docs = _tiny_docs(tiny.tokenizer)
    empty = TokenDoc(docs[0].ids, [])
    done = []
    results = score_documents(tiny.model, [docs[1], empty, docs[2], docs[0]], pad_id=0, batch_size=2,
                              progress=done.append)
    assert results[1] == [] and sum(done) == sum(len(d.positions) for d in docs)  # progress counts targets
    for doc, rows in zip([docs[1], docs[2], docs[0]], [results[0], results[2], results[3]]):
        assert [r["position"] for r in rows] == doc.positions
        assert [r["target_id"] for r in rows] == [doc.ids[p] for p in doc.positions]


@pytest.mark.model
def test_one_forward_pass_per_batch_whatever_the_targets(tiny, monkeypatch):
    docs = _tiny_docs(tiny.tokenizer)
    calls = []
    handle = tiny.model.register_forward_pre_hook(lambda module, args, kwargs: calls.append(kwargs["input_ids"].shape),
                                                  with_kwargs=True)
    try:
        score_documents(tiny.model, docs, pad_id=0, batch_size=8)
        score_documents(tiny.model, docs, pad_id=0, batch_size=2)
    finally:
        handle.remove()
    assert [shape[0] for shape in calls] == [3, 2, 1]  # 12 targets: 1 pass, then 2 (longest first)
    # A forward that ignores the boolean logits_to_keep (full (B, T, V) logits) is refused, not misread.
    forward = tiny.model.forward
    monkeypatch.setattr(tiny.model, "forward", lambda **kw: forward(**{**kw, "logits_to_keep": 0}))
    with pytest.raises(ScoringError, match="boolean logits_to_keep"):
        score_documents(tiny.model, docs, pad_id=0)


@pytest.mark.model
def test_a_target_past_the_context_is_refused_naming_the_document(tiny):
    ids = list(range(3, 603))  # 600 tokens; the tiny model reads 512
    docs = [TokenDoc(ids, [5]), TokenDoc(ids, [10, 599])]
    with pytest.raises(DataError, match=r"1 of 2 documents .* context of 512 tokens .*document 1: last target at position 599"):
        score_documents(tiny.model, docs, pad_id=0)
    # Only the tokens before the last target are fed: a long document with early targets is scored.
    assert len(score_documents(tiny.model, [TokenDoc(ids, [5, 512])], pad_id=0)[0]) == 2


@pytest.mark.unit
def test_bad_positions_are_refused():
    with pytest.raises(ValueError, match=r"document 0's positions in \[1, 3\)"):
        score_documents(torch.nn.Linear(1, 1), [TokenDoc([1, 2, 3], [0])], pad_id=0)
    with pytest.raises(ValueError, match="one entity per position"):
        score_documents(torch.nn.Linear(1, 1), [TokenDoc([1, 2, 3], [1, 2], [0])], pad_id=0)
    with pytest.raises(ValueError, match="`temperature` to be a finite number larger than 0"):
        score_documents(torch.nn.Linear(1, 1), [TokenDoc([1, 2, 3], [1])], pad_id=0, temperature=0.0)


# ---------------------------------------------------------------- targets against the text (bundled tokenizer)


@pytest.fixture(scope="module")
def tokenizer():
    """The bundled model's tokenizer alone (its tests are marked `model`: the first use converts the GGUF)."""
    from transformers import AutoTokenizer

    from lab.models.bundled import bundled_model_dir

    return AutoTokenizer.from_pretrained(bundled_model_dir())


TEXTS = ["The capital of France is Paris. It lies on the Seine, and Paris-based firms abound.",
         "Marie Curie was born in Warsaw in 1867;\nshe won two Nobel Prizes (physics, chemistry).",
         "A counterexample: superconductivity at 39 K in MgB2, found in 2001 — or was it?"]


def _check_token(tokenizer, whole: str, ids: list[int], p: int) -> tuple[int, int]:
    """The characters [start, end) of ``whole`` that token p stands for, found by decoding alone; asserts
    that the decoded tokens before p are exactly the text before it."""
    before, through = (tokenizer.decode(ids[:p], skip_special_tokens=True),
                       tokenizer.decode(ids[: p + 1], skip_special_tokens=True))  # a BOS stands for no text
    assert whole.startswith(through) and through.startswith(before)
    return len(before), len(through)


@pytest.mark.model
@pytest.mark.parametrize("prefix", ["", PREFIX])
def test_every_target_is_the_texts_token_there(bundled, prefix):
    rng = np.random.default_rng(3)
    docs, spans_of = [], []
    for text in TEXTS:
        ids, spans = encode(bundled.tokenizer, text, prefix)
        assert ids == bundled.tokenizer(prefix + text)["input_ids"]  # the tokenisation the model reads
        docs.append(TokenDoc(ids, clm_positions(len(ids), 6, 1, rng)))
        spans_of.append(spans)
    for text, doc, spans, rows in zip(TEXTS, docs, spans_of, score_documents(bundled.model, docs, bundled.tokenizer.eos_token_id)):
        assert len(rows) == 6
        for r in rows:
            p = r["position"]
            start, end = _check_token(bundled.tokenizer, prefix + text, doc.ids, p)
            assert r["target_id"] == bundled.tokenizer(prefix + text)["input_ids"][p]
            if end > len(prefix):  # a token of the text: its span, shifted by the prefix, is the decoded one
                assert spans[p] == (max(start - len(prefix), 0), end - len(prefix))
            else:
                assert spans[p] == (-1, -1)
            assert r["pred_id"] == r["top_ids"][0] and r["confidence"] == r["top_probs"][0] >= r["target_prob"]


def _entity_targets(tokenizer, text: str, entities, prefix: str = "", bos=None) -> list[tuple[int, str]]:
    ids, spans = with_bos(*encode(tokenizer, text, prefix), bos)
    out = []
    for k, p in facts_positions(spans, entities)[0]:
        start, end = _check_token(tokenizer, prefix + text, ids, p)
        assert start <= len(prefix) + entities[k][0] < end  # the token holds the entity's first character
        out.append((k, tokenizer.decode([ids[p]])))
    return out


@pytest.mark.model
def test_facts_target_the_merged_space_token(tokenizer):
    text = TEXTS[0]
    paris = text.index("Paris")
    assert _entity_targets(tokenizer, text, [(paris, paris + 5)]) == [(0, " Paris")]
    # Preceded by "(" the word is its own token; an entity given with its space targets the same token.
    assert _entity_targets(tokenizer, "firms (Paris) abound", [(7, 12)]) == [(0, "Paris")]
    assert _entity_targets(tokenizer, text, [(paris - 1, paris + 5)]) == [(0, " Paris")]


@pytest.mark.model
def test_facts_entity_at_the_start_of_the_text(tokenizer):
    text = "Paris is the capital of France."
    assert _entity_targets(tokenizer, text, [(0, 5), (24, 30)]) == [(1, " France")]  # position 0: no context
    # After the paper's prompt the prefix's space merges into the entity's token: that token is the target.
    assert _entity_targets(tokenizer, text, [(0, 5), (24, 30)], PREFIX) == [(0, " Paris"), (1, " France")]
    # Read from the model's BOS token, the entity that opens the text is predicted from that.
    bos = tokenizer.bos_token_id
    assert _entity_targets(tokenizer, text, [(0, 5), (24, 30)], bos=bos) == [(0, "Paris"), (1, " France")]
    assert with_bos(*encode(tokenizer, text, PREFIX), bos) == encode(tokenizer, text, PREFIX)  # the prefix precedes it


@pytest.mark.model
def test_facts_two_entities_and_one_inside_a_word(tokenizer):
    text = TEXTS[1]
    entities = [(0, 11), (text.index("Warsaw"), text.index("Warsaw") + 6)]
    assert _entity_targets(tokenizer, text, entities, PREFIX) == [(0, " Marie"), (1, " Warsaw")]
    # "example" starts inside the token "ere" of " count|ere|x|ample": that token is the target.
    assert _entity_targets(tokenizer, "a counterexample", [(9, 16)]) == [(0, "ere")]
    # Past the end of the text: no token, left out.
    assert _entity_targets(tokenizer, "a counterexample", [(40, 45)]) == []


@pytest.mark.unit
def test_facts_positions_on_hand_made_spans():
    spans = [(-1, -1), (0, 3), (3, 9), (10, 15), (15, 15 + 1), (15, 16)]  # BOS; trimmed space at 9; a 2-byte char
    assert facts_positions(spans, [(0, 3), (4, 6), (9, 12), (15, 16), (30, 31)]) == (
        [(0, 1), (1, 2), (2, 3), (3, 4)], [(4, "no token of the text covers it")])
    assert facts_positions(spans, [(9, 10)]) == ([], [(0, "no token starts inside it")])  # whitespace only
    # Without a BOS the text's first token is position 0: left out, and said why; with one, its target.
    assert facts_positions(spans[1:], [(0, 3)]) == ([], [(0, "it opens the text and the tokenizer has no BOS "
                                                             "token to predict it from")])
    ids, placed = with_bos([7, 8, 9, 10, 11], spans[1:], 99)
    assert ids[0] == 99 and placed == [NO_SPAN, *spans[1:]] and facts_positions(placed, [(0, 3)]) == ([(0, 1)], [])
    assert with_bos([7, 8], spans[1:3], None) == ([7, 8], spans[1:3])  # a tokenizer with no BOS token
    with pytest.raises(ValueError, match=r"entity 1 .* got \(5, 5\)"):
        facts_positions(spans, [(0, 3), (5, 5)])


@pytest.mark.unit
def test_encode_refuses_a_slow_tokenizer():
    class Slow:
        is_fast = False

    with pytest.raises(ValueError, match="fast tokenizer"):
        encode(Slow(), "text")


# ---------------------------------------------------------------- clm positions


@pytest.mark.unit
def test_clm_positions_are_seeded_distinct_and_in_range():
    draw = lambda seed, *args: clm_positions(*args, np.random.default_rng(seed))  # noqa: E731
    assert draw(0, 100, 5, 10) == draw(0, 100, 5, 10) != draw(1, 100, 5, 10)
    for seed in range(50):
        got = draw(seed, 40, 8, 12)
        assert len(got) == len(set(got)) == 8 and got == sorted(got) and all(12 <= p < 40 for p in got)
    assert draw(0, 15, 10, 12) == [12, 13, 14]  # fewer when the document is short
    assert draw(0, 12, 3, 12) == [] and draw(0, 5, 3, 12) == []  # no token after min_context: skipped
    assert draw(0, 1, 3, 0) == [] and 0 not in draw(0, 3, 3, 0)  # position 0 has no context
    # Uniform over the range: every position is drawn about equally often.
    counts = np.bincount([p for s in range(2000) for p in draw(s, 20, 1, 10)], minlength=20)[10:]
    assert counts.min() > 150 and counts.max() < 250
    with pytest.raises(ValueError, match="at least 0"):
        draw(0, 10, -1, 0)
