"""Several models on the user's own question (the compare job), with the bundled model."""
import json

import numpy as np
import pytest

from lab.compare import CompareConfig, compare, read_result
from lab.temperature import scale


def test_compare_scores_options_applies_temperatures_and_generates(bundled, tmp_path):
    cfg = CompareConfig(question="What is the capital of Norway?", options=["Oslo", "Helsinki", "Stockholm"],
                        models=[{"model": "bundled"}, {"model": "bundled", "temperature": 4.0, "label": "flattened"}],
                        max_new_tokens=4, device="cpu")
    report = compare(cfg, tmp_path, log=lambda m: None)
    plain, flat = report["results"]
    assert flat["label"] == "flattened" and plain["label"] == "bundled"
    assert sum(plain["probs"]) == pytest.approx(1.0) and plain["raw_probs"] == plain["probs"]
    np.testing.assert_allclose(flat["probs"], scale(np.array([flat["raw_probs"]]), 4.0)[0])
    assert max(flat["probs"]) < max(plain["probs"])  # a higher temperature is less sure
    assert plain["generation"]["text"] and 0 < plain["generation"]["sequence_prob"] <= 1
    assert plain["generation"]["sequence_prob"] <= plain["generation"]["first_token_prob"]
    assert read_result(tmp_path) == json.loads((tmp_path / "compare.json").read_text())


def test_free_text_only_generates(bundled, tmp_path):
    report = compare(CompareConfig(question="Say hello.", max_new_tokens=3, device="cpu"), tmp_path, log=lambda m: None)
    (only,) = report["results"]
    assert "probs" not in only and only["generation"]["tokens"] <= 3


@pytest.mark.parametrize("bad, message", [
    ({"question": " "}, "^question: must not be empty"), ({"question": "Q", "options": ["a"]}, "^options: give 2 to 26"),
    ({"question": "Q", "options": list("abcdefghijklmnopqrstuvwxyz0")}, "^options: has 27 entries; the limit is 26"),
    ({"question": "Q", "models": []}, "^models: name 1 to 4"),
    ({"question": "Q", "models": [{"model": "bundled"}] * 5}, "^models: has 5 entries; the limit is 4"),
    ({"question": "Q", "models": [{"model": "bundled", "temp": 2}]}, r"^models\[0\].temp: unknown key; did you mean temperature"),
    ({"question": "Q", "models": [{"adapter": "x"}]}, r"^models\[0\].model: must be set"),
    ({"question": "Q", "models": [{"model": "bundled", "temperature": -1}]}, r"^models\[0\].temperature: must be a temperature > 0"),
    ({"question": "Q" * 20_001}, "^question: is 20,001 characters long; the limit is 20,000")])
def test_bad_compare_configs_are_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        CompareConfig.from_dict(bad)
