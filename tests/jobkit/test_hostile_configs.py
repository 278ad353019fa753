"""Hostile configs: the path policy over every config class and every value shape, a fuzz of
path strings that must never yield (or open) a file outside the allowed folders, and bounded
YAML. Every config from a browser goes through ``parse_config(values, roots)``."""
import dataclasses
import json
import os
import random
import sys
import typing
from pathlib import Path

import pytest

from lab.core import yamlio
from lab.core.config import PATH_ROLES, ConfigError, spec_of, unwrap_optional, walk
from lab.core.yamlio import MAX_BYTES, MAX_DEPTH, load_yaml
from lab.jobkit import kinds
from lab.jobkit.kinds import parse_config
from lab.jobkit.paths import PathNotAllowed
from lab.models.weights import NAMED_MODELS
from ui.context import LabContext

QUESTION = json.dumps({"question": "2+2?", "choices": ["4", "5"], "answer": "A"}) + "\n"
# Fields declared free text: shown or scored, never opened. A new one must be added here on purpose.
FREE_TEXT = {("CompareConfig", "question"), ("CompareConfig", "options"), ("CompareModel", "label"),
             ("CompareQuestion", "question"), ("CompareQuestion", "options"), ("SeriesModel", "stage")}


def config_classes() -> list[type]:
    """Every job kind's config class and every entry schema nested in one."""
    seen: list[type] = []
    stack = [k.config for k in kinds.all_kinds()]
    while stack:
        cls = stack.pop()
        if cls not in seen:
            seen.append(cls)
            stack += [spec_of(f).entries for f in dataclasses.fields(cls) if spec_of(f).entries]
    return seen


def _kind_of(hint):
    hint, _ = unwrap_optional(hint)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is list:
        return "list", unwrap_optional(args[0])[0]
    return "one", hint


@pytest.fixture
def tree(tmp_path):
    """runs/ (allowed) with data, a model folder and symlinks leading out to secret/ (not allowed)."""
    root, secret = tmp_path / "runs", tmp_path / "secret"
    (root / "data" / "sub").mkdir(parents=True)
    secret.mkdir()
    (root / "data" / "q.jsonl").write_text(QUESTION)
    (root / "data" / "sub" / "r.jsonl").write_text(QUESTION)
    (secret / "secret.jsonl").write_text(json.dumps({"question": "SECRET", "choices": ["a", "b"], "answer": 0}))
    (secret / "creds.csv").write_text("user,password\nroot,hunter2\n")
    (secret / "temperature.json").write_text('{"temperature": 2.0}')
    (root / "link").symlink_to(secret)
    (root / "data" / "linked.jsonl").symlink_to(secret / "secret.jsonl")
    (root / "model").mkdir()
    (root / "model" / "config.json").write_text("{}")
    (root / "badmodel").mkdir()
    (root / "badmodel" / "config.json").symlink_to(secret / "creds.csv")
    return root, secret


# ---------------------------------------------------------------- declarations
@pytest.mark.unit
@pytest.mark.parametrize("cls", config_classes(), ids=lambda c: c.__name__)
def test_every_field_declares_what_it_is(cls):
    """A field that takes text must say what the text is; numbers have both bounds; nested
    mappings have a schema. A new path field cannot be added without the resolver seeing it."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        spec, (_, base) = spec_of(f), _kind_of(hints[f.name])
        where = f"{cls.__name__}.{f.name}"
        if base is str:
            assert spec.role in (*PATH_ROLES, "name", "text"), f"{where} takes text but declares no role"
            if spec.role == "name":
                assert spec.registry is not None or spec.pattern, f"{where}: a name needs a registry or a pattern"
            if spec.role == "text":
                assert (cls.__name__, f.name) in FREE_TEXT, f"{where} is free text: is it really never opened?"
        elif base in (int, float):
            assert (spec.ge is not None or spec.gt is not None) and (spec.le is not None or spec.lt is not None), \
                f"{where} is a number without both bounds"
        elif typing.get_args(base) == (str, str):  # a flat mapping of names to sizes (max_memory)
            assert spec.key_pattern and spec.max_items and spec.max_len, \
                f"{where} maps text to text without a key pattern, a number of keys and a value length"
        elif typing.get_origin(base) is dict or base is dict:
            assert spec.entries is not None, f"{where} is a mapping without an entry schema"
        else:
            assert base is bool or typing.get_origin(base) is typing.Literal, f"{where}: unchecked type {base!r}"


@pytest.mark.unit
@pytest.mark.parametrize("cls", [k.config for k in kinds.all_kinds()], ids=lambda c: c.__name__)
def test_every_text_field_given_an_outside_path_is_refused_or_is_free_text(cls, tree):
    """The dynamic half of the policy: put a path outside the roots into each text field of a
    kind (nested entries too); unless the field is declared free text, the config is refused."""
    root, secret = tree
    canary = str(secret / "secret.jsonl")
    base = {"question": "Q?"} if cls.__name__ == "CompareConfig" else {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        spec, (shape, kind) = spec_of(f), _kind_of(hints[f.name])
        if spec.entries is not None:
            entry_hints = typing.get_type_hints(spec.entries)
            for g in dataclasses.fields(spec.entries):
                if g.name in spec.exclude or _kind_of(entry_hints[g.name])[1] is not str:
                    continue
                entry = {"dataset": "custom"} if "dataset" in entry_hints else {"model": "bundled"}
                entry[g.name] = [canary] if _kind_of(entry_hints[g.name])[0] == "list" else canary
                value = entry if typing.get_origin(unwrap_optional(hints[f.name])[0]) is dict else [entry]
                _assert_refused_or_free(cls, spec.entries, g, {**base, f.name: value}, root)
        elif kind is str:
            _assert_refused_or_free(cls, cls, f, {**base, f.name: [canary] if shape == "list" else canary}, root)


def _assert_refused_or_free(kind_cls, owner, f, config, root):
    kind = next(k.name for k in kinds.all_kinds() if k.config is kind_cls)
    if (owner.__name__, f.name) in FREE_TEXT:
        return
    with pytest.raises(ConfigError) as refused:
        parse_config({"kind": kind, **config}, [root])
    if spec_of(f).role in PATH_ROLES:
        assert isinstance(refused.value, PathNotAllowed), f"{owner.__name__}.{f.name}: {refused.value}"


@pytest.mark.unit
@pytest.mark.parametrize("cls", config_classes(), ids=lambda c: c.__name__)
def test_a_lora_run_s_adapter_goes_only_to_a_folder_field_beside_a_model_field(cls):
    """A model field (every one takes ``run:<id>``) that names where a LoRA run's adapter goes names an
    adapter folder field of its own entry; no other field names one."""
    declared = {f.name: spec_of(f) for f in dataclasses.fields(cls)}
    for name, spec in declared.items():
        if spec.adapter_field:
            assert spec.role == "model" and declared[spec.adapter_field].role == "dir", f"{cls.__name__}.{name}"


@pytest.mark.unit
@pytest.mark.parametrize("cls", [k.config for k in kinds.all_kinds()], ids=lambda c: c.__name__)
@pytest.mark.parametrize("value", ["run:../secret", "run:1/../../x", "run:1e3", "run:-1", "run:99999"])
def test_every_model_field_refuses_a_hostile_or_unknown_job_reference(cls, value, tree):
    root, _ = tree
    kind = next(k.name for k in kinds.all_kinds() if k.config is cls)
    base = {"question": "Q?"} if kind == "compare" else {}
    hints, tried = typing.get_type_hints(cls), 0
    for f in dataclasses.fields(cls):
        spec = spec_of(f)
        if spec.role == "model":
            config = {f.name: value}
        elif spec.entries is not None and "model" not in spec.exclude and spec_of(
                next((g for g in dataclasses.fields(spec.entries) if g.name == "model"), f)).role == "model":
            entry = {"model": value}
            config = {f.name: entry if typing.get_origin(unwrap_optional(hints[f.name])[0]) is dict else [entry]}
        else:
            continue
        tried += 1
        with pytest.raises(ConfigError, match="is not a job reference|there is no job 99999"):
            parse_config({"kind": kind, **base, **config}, [root], runs=root)
    assert tried, f"{kind} has no model field"


# ---------------------------------------------------------------- the defects found
@pytest.mark.unit
def test_globs_climbing_out_and_mappings_are_refused_before_queueing(tree):
    root, secret = tree
    ctx = LabContext(root)
    attacks = [
        {"kind": "evaluate", "dataset": "custom", "data_files": [f"{root}/*/../../secret/secret.jsonl"]},
        {"kind": "evaluate", "dataset": "custom", "data_files": [f"{root}/*/../../../../etc/passwd"]},
        {"kind": "evaluate", "dataset": "custom", "data_files": {str(secret / "creds.csv"): "x"}},
        {"kind": "evaluate", "dataset": "custom", "data_files": [{str(secret / "creds.csv"): "x"}]},
        {"kind": "evaluate", "dataset": "custom", "data_files": [[str(secret / "creds.csv")]]},
        {"kind": "cft", "in_domain": [{"dataset": "custom", "data_files": {str(secret / "creds.csv"): "x"}}]},
        {"kind": "evaluate", "dataset": "custom", "data_files": [f"{root}/link/*.jsonl"]},
        {"kind": "evaluate", "dataset": "custom", "data_files": [f"{root}/data/*.jsonl"]},  # linked.jsonl leads out
        {"kind": "evaluate", "dataset": "custom", "data_files": [f"{root}/**/*.jsonl"]},
        {"kind": "evaluate", "dataset": "custom", "data_files": [f"test={root}/link/secret.jsonl"]},
        {"kind": "evaluate", "dataset": "custom", "data_files": [str(root / "data")]},  # a folder holding the link
        {"kind": "evaluate", "model": str(root / "badmodel")},  # a symlink inside a model folder
        {"kind": "evaluate", "temperature": str(root / "link")},
        {"kind": "compare", "question": "Q?", "models": [{"model": "bundled", "adapter": str(secret)}]},
        {"kind": "cft", "preferences": [str(root / "link" / "*")]},
        {"kind": "evaluate", "data_files": ["~/.bashrc"]},
    ]
    for config in attacks:
        with pytest.raises(ConfigError) as refused:
            ctx.submit(config)
        message = str(refused.value)
        assert "hunter2" not in message and "SECRET" not in message and "user,password" not in message
        assert message.split(":")[0] in ("data_files", "data_files[0]", "in_domain[0].data_files", "model",
                                         "temperature", "models[0].adapter", "preferences[0]"), message
    assert ctx.store.list() == []


@pytest.mark.unit
def test_the_stored_job_holds_the_resolved_files_and_the_worker_reads_only_those(tree):
    root, _ = tree
    (root / "data" / "linked.jsonl").unlink()
    ctx = LabContext(root)
    job = ctx.submit({"kind": "evaluate", "dataset": "custom", "data_files": [f"test={root}/data/*.jsonl",
                                                                              str(root / "data" / "sub")]})
    stored = job.config_dict["data_files"]
    assert stored == [f"test={(root / 'data' / 'q.jsonl').resolve()}", str((root / "data" / "sub" / "r.jsonl").resolve())]
    # The worker parses the stored config again: the same concrete files, no glob left to expand.
    (root / "data" / "later.jsonl").write_text(QUESTION)
    _, cfg = parse_config(job.config_dict)
    assert cfg.data_files == stored


@pytest.mark.unit
def test_paths_inside_the_roots_resolve_through_dots_and_home(tree, monkeypatch):
    root, _ = tree
    monkeypatch.setenv("HOME", str(root))
    _, cfg = parse_config({"kind": "evaluate", "dataset": "custom", "model": str(root / "model" / ".." / "model"),
                           "data_files": ["~/data/q.jsonl"], "temperature": "1.5"}, [root])
    assert cfg.data_files == [str((root / "data" / "q.jsonl").resolve())]
    assert cfg.model == str((root / "model").resolve()) and cfg.temperature == 1.5


@pytest.mark.unit
def test_hub_ids_are_names_not_paths(tree, monkeypatch):
    root, _ = tree
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for bad in ("a/../b", "org/name/extra", "a--b/c", "-x/y", "org/na me"):
        with pytest.raises(ConfigError, match="neither 'bundled'"):
            parse_config({"kind": "evaluate", "model": bad}, [root])
    with pytest.raises(ConfigError, match="unknown model 'no-such-org/no-such-model'"):
        parse_config({"kind": "evaluate", "model": "no-such-org/no-such-model"}, [root])


# ---------------------------------------------------------------- the fuzz
PIECES = ["..", "*", "**", "?", "[a-z]*", "link", "data", "sub", "secret", "q.jsonl", "secret.jsonl", "linked.jsonl",
          "*.jsonl", ".", "~", "etc", "passwd", "model", "badmodel", "temperature.json"]


def _random_path(rng: random.Random, root: Path) -> str:
    start = rng.choice([str(root), str(root.parent), "/", "~", ".", "", "test=" + str(root), "train=/"])
    parts = [rng.choice(PIECES) for _ in range(rng.randint(0, 5))]
    return "/".join([start, *parts]) if start else "/".join(parts)


def _random_shape(rng: random.Random, path: str):
    return rng.choice([path, [path], [path, path], {path: 1}, [[path]], [{path: path}], {"a": [path]}, 7, None])


def _fields_with_roles(cls):
    hints = typing.get_type_hints(cls)
    return [(f.name, spec_of(f)) for f in dataclasses.fields(cls)
            if spec_of(f).role in PATH_ROLES or spec_of(f).entries is not None
            if _kind_of(hints[f.name])[1] is not bool]


@pytest.mark.unit
@pytest.mark.slow
def test_fuzzed_paths_never_resolve_to_or_open_a_file_outside(tree, monkeypatch):
    """2,000 random configs: each path field (nested entries too) gets a random path in a random
    shape. Whatever is accepted resolves only to files inside the root, and no file outside is
    opened while configs are checked (an audit hook watches every open). A glob may still list a
    folder that a symlink inside the root points to; what it finds there is refused, unnamed."""
    root, secret = tree
    monkeypatch.setenv("HOME", str(secret))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    touched: list[str] = []

    def audit(event: str, args: tuple) -> None:
        if event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
            path = os.fsdecode(args[0])
            if path and str(secret) in os.path.realpath(path):
                touched.append(f"{event} {path}")

    sys.addaudithook(audit)
    rng = random.Random(0)
    names = kinds.names()
    accepted = 0
    for _ in range(2000):
        kind = rng.choice(names)
        cls = kinds.get(kind).config
        name, spec = rng.choice(_fields_with_roles(cls))
        path = _random_path(rng, root)
        if spec.entries is not None:
            entry_fields = [n for n, s in _fields_with_roles(spec.entries) if n not in spec.exclude]
            if not entry_fields:
                continue
            allowed = {f.name for f in dataclasses.fields(spec.entries)} - set(spec.exclude)
            # an entry that is valid but for the fuzzed field: a series' model entry takes one source only
            entry = ({"dataset": "custom"} if kind in ("cft", "first") else
                     {"model": "bundled"} if "model" in allowed and name != "models" else {})
            entry[rng.choice(entry_fields)] = _random_shape(rng, path)
            value = [entry] if name != "training" else entry
        else:
            value = _random_shape(rng, path)
        config = {"kind": kind, name: value, **({"question": "Q?"} if kind == "compare" else {})}
        try:
            _, parsed = parse_config(config, [root])
        except ConfigError:
            continue
        accepted += 1
        for field, fspec, holder, key, _ in walk(cls, parsed.to_dict()):
            values = holder[key] if isinstance(holder[key], list) else [holder[key]]
            for v in values:
                if fspec.role in PATH_ROLES and isinstance(v, str) and v not in ("bundled", *NAMED_MODELS):
                    real = os.path.realpath(v.split("=", 1)[1] if "=" in v and not os.path.exists(v) else v)
                    assert real.startswith(str(root.resolve())), f"{config} → {field} = {v}"
    assert touched == [] and accepted > 50, (touched[:20], accepted)


# ---------------------------------------------------------------- bounded YAML
@pytest.mark.unit
def test_yaml_alias_bombs_size_depth_and_encoding_are_refused_at_once(monkeypatch):
    bomb = "a: &a [x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n" \
           "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: [*d,*d,*d,*d,*d,*d,*d,*d,*d]\nkind: evaluate\n"
    with pytest.raises(ConfigError, match="anchors and aliases"):
        load_yaml(bomb)
    with pytest.raises(ConfigError, match=f"the limit is {MAX_BYTES:,} bytes"):
        load_yaml("kind: evaluate\n" + "# padding\n" * (MAX_BYTES // 10 + 1))
    with pytest.raises(ConfigError, match=f"nested more than {MAX_DEPTH} levels"):
        load_yaml("data_files: " + "[" * 5000 + "]" * 5000)
    with pytest.raises(ConfigError, match=r"not UTF-8 text \(byte 0xff at position 6\)"):
        load_yaml(b"kind: \xffevaluate")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_yaml("kind: [evaluate")
    monkeypatch.setattr(yamlio, "MAX_NODES", 1000)
    with pytest.raises(ConfigError, match="more than 1,000 values"):
        load_yaml("kind: evaluate\ndata_files:\n" + "- x\n" * 1000)
    monkeypatch.setattr(yamlio, "BUDGET_S", 0.0)
    with pytest.raises(ConfigError, match="took more than 0 s to parse"):
        load_yaml("kind: evaluate\n")


# ---------------------------------------------------------------- one message from every entry point
# (YAML, the message every entry point must give, whether the launch form can express it)
BAD_CONFIGS = [
    # Values that passed submit and failed at run time (issue 30, S5).
    ("kind: evaluate\ntemperature: 1.0e-320\n", "temperature: must be a temperature from 0.001 to 1000 (a number, a "
     "temperature.json or its folder), got 1e-320", True),
    ("kind: evaluate\ndevice: cuda:999\n", "device: cuda:999 needs a GPU, but the job asks for none; ask for a GPU, "
     "or set device to auto or cpu", True),
    ("kind: evaluate\ndataset: custom\ndata_files: []\n", "data_files: empty, so the Hugging Face hub copy of custom is "
     "meant, but custom has no copy on the Hugging Face hub: set data_files (--data-files on the command line) to its "
     "files, in this format: JSON Lines, a JSON list of objects, or CSV with a header, with the fields question; choices "
     "(a JSON list) or one column per option A, B, C, ...; answer (a letter, a 0-based index or the text of the right "
     "choice); optionally id and passage (or context).", False),
    ("kind: first\nts_grid: []\n", "ts_grid: must have at least 1 entry, or be left unset for the default", False),
    ("kind: evaluate\nlimit: -1\n", "limit: must be an integer ≥ 1 and ≤ 10,000,000, got -1", True),
    ("kind: evaluate\nlimit: true\n", "limit: must be an integer ≥ 1 and ≤ 10,000,000, got True", False),
    ("kind: evaluate\nlimit: .inf\n", "limit: must be an integer ≥ 1 and ≤ 10,000,000, got inf", True),
    ("kind: evaluate\nlimit: .nan\n", "limit: must be an integer ≥ 1 and ≤ 10,000,000, got nan", True),
    ("kind: evaluate\nbins: 1000000000\n", "bins: must be an integer ≥ 1 and ≤ 1,000, got 1000000000", True),
    ("kind: evaluate\nbootstrap: .nan\n", "bootstrap: must be an integer ≥ 0 and ≤ 100,000, got nan", True),
    ("kind: evaluate\nbootstrap: 1000000000000\n", "bootstrap: must be an integer ≥ 0 and ≤ 100,000, got 1000000000000", True),
    ("kind: evaluate\nseed: abc\n", "seed: must be an integer ≥ 0 and ≤ 4,294,967,295, got 'abc'", True),
    ("kind: evaluate\nmodel: 123\n", "model: must be text, got 123", False),
    ("kind: evaluate\ndata_files: [[a.jsonl]]\n", "data_files[0]: must be text, got ['a.jsonl']", False),
    ("kind: evaluate\ndata_files: {/tmp/x/creds.csv: x}\n", "data_files: must be a list, got {'/tmp/x/creds.csv': 'x'}", False),
    ("kind: [evaluate]\n", "kind: must be one of evaluate, finetune, sft, dpo, first, cft, extract, compare, series, "
                          "got ['evaluate']", False),
    ("kind: finetune\nlearning_rate: .nan\n", "learning_rate: must be a finite number > 0 and ≤ 10, got nan", True),
    ("kind: finetune\nlearning_rate: .inf\n", "learning_rate: must be a finite number > 0 and ≤ 10, got inf", True),
    ("kind: finetune\nepochs: 1.0e+9\n", "epochs: must be a finite number > 0 and ≤ 1,000, got 1000000000.0", True),
    ("kind: cft\nlambdas: [.nan]\n", "lambdas[0]: must be a finite number ≥ 0 and ≤ 1,000, got nan", True),
    ("kind: cft\ntraining: {learning_rate: .nan}\n", "training.learning_rate: must be a finite number > 0 and ≤ 10, got nan", True),
    ("kind: first\neval_batch_size: 0\n", "eval_batch_size: must be an integer ≥ 1 and ≤ 4,096, got 0", True),
    ("kind: first\nbootstrap: -5\n", "bootstrap: must be an integer ≥ 0 and ≤ 100,000, got -5", True),
    ("kind: first\nood: [{dataset: arc_challenge, limt: 5}]\n",
     "ood[0].limt: unknown key; did you mean limit? (valid: dataset, data_files, subject, split, limit, template, "
     "num_fewshot, fewshot_split, lm_eval_include)", True),
    ("a: &a [x, x]\nb: [*a, *a]\n", "YAML anchors and aliases (&name, *name) are not accepted in a config; write each value out", False),
]


def _form_message(ctx: LabContext, config: dict) -> str:
    """What the launch form's Submit answers for ``config`` typed into its fields."""
    from ui import forms

    kind = config.pop("kind")
    form = forms.fields(kind)
    values = forms.preset_values(kind, None)
    for key, value in config.items():
        values[[f.name for f in form].index(key)] = forms.to_widget_value(form[[f.name for f in form].index(key)], value)
    try:
        ctx.submit(forms.form_config(kind, values))  # what the page's Submit does
    except ConfigError as e:
        return str(e)
    return "accepted"


@pytest.mark.e2e
@pytest.mark.slow
def test_bad_configs_get_the_same_message_from_the_cli_the_api_and_the_form(served_bare, tmp_path, capsys):
    from gradio_client import Client

    from jobs.cli import main as jobs_cli

    ctx, url = served_bare
    client = Client(url, verbose=False)
    for text, message, in_form in BAD_CONFIGS:
        path = tmp_path / "bad.yaml"
        path.write_text(text)
        assert jobs_cli(["--root", str(ctx.runs), "submit", str(path)]) == 2
        assert capsys.readouterr().err == f"error: {message}\n"
        assert client.predict(text, 0, api_name="/submit_job") == {"ok": False, "error": message}
        if in_form:
            assert _form_message(ctx, load_yaml(text)) == message
    assert ctx.store.list() == []
    good = client.predict("kind: evaluate\nmodel: bundled\nlimit: 5\n", 0, api_name="/submit_job")
    assert good["ok"] and client.predict(good["id"], api_name="/job_status")["ok"]  # the server kept serving


@pytest.mark.e2e
@pytest.mark.slow
def test_the_public_api_is_exactly_what_the_readme_lists(served_bare):
    import urllib.request

    _, url = served_bare
    info = json.loads(urllib.request.urlopen(url + "gradio_api/info").read())
    assert sorted(info["named_endpoints"]) == ["/job_status", "/run_metrics", "/submit_job"]
    assert not info["unnamed_endpoints"]
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    assert all(f'api_name="{name}"' in readme for name in info["named_endpoints"])


@pytest.mark.unit
def test_the_cli_names_a_config_that_is_not_utf8_or_too_big(tmp_path, capsys):
    from jobs.cli import main as jobs_cli

    path = tmp_path / "latin1.yaml"
    path.write_bytes("kind: evaluate\nsubject: caf\xe9\n".encode("latin-1"))
    assert jobs_cli(["--root", str(tmp_path / "runs"), "submit", str(path)]) == 2
    assert capsys.readouterr().err == f"error: {path} is not UTF-8 text (byte 0xe9 at position 27); save it as UTF-8\n"
    path.write_text("kind: evaluate\n" + "#" * MAX_BYTES)
    assert jobs_cli(["--root", str(tmp_path / "runs"), "submit", str(path)]) == 2
    assert f"the limit is {MAX_BYTES:,} bytes" in capsys.readouterr().err


# ---------------------------------------------------------------- state that changes between submit and run
def _swap_for_link(path: Path, target: Path) -> None:
    path.unlink()
    path.symlink_to(target)


@pytest.mark.unit
def test_a_file_swapped_for_a_link_after_submit_is_refused_by_the_worker(tree, capsys):
    from lab.core.layout import CONFIG_FILE, RESULT_FILE
    from lab.jobkit.worker import run

    root, secret = tree
    ctx = LabContext(root)
    job = ctx.submit({"kind": "evaluate", "dataset": "custom", "data_files": [str(root / "data" / "q.jsonl")]})
    _swap_for_link(root / "data" / "q.jsonl", secret / "secret.jsonl")
    run_dir = Path(job.run_dir)
    assert run(run_dir / CONFIG_FILE, run_dir) == 2
    result = json.loads((run_dir / RESULT_FILE).read_text())
    assert result["status"] == "failed" and "leads outside the folders" in result["error"]
    assert "SECRET" not in result["error"] + capsys.readouterr().err


@pytest.mark.unit
def test_a_swap_between_the_worker_s_check_and_the_open_is_caught_at_the_open(tree):
    """The worker checks its config at start; a file swapped after that, while the model loads, is
    caught where it is opened: a link in its place is not followed, nor one in a folder above it."""
    from lab.core.reads import restricted
    from lab.data.custom import read_custom as read_file

    root, secret = tree
    (root / "data" / "q2.jsonl").write_text(QUESTION)
    with restricted([root]):
        assert [r.question for r in read_file(root / "data" / "q2.jsonl") if hasattr(r, "question")]
        _swap_for_link(root / "data" / "q2.jsonl", secret / "secret.jsonl")
        with pytest.raises(PathNotAllowed, match="replaced by a symbolic link"):
            list(read_file(root / "data" / "q2.jsonl"))
        (root / "data" / "sub" / "r.jsonl").unlink()
        (root / "data" / "sub").rmdir()
        (root / "data" / "sub").symlink_to(secret)  # a folder above the file, now leading out
        (secret / "r.jsonl").write_text(json.dumps({"question": "SECRET", "choices": ["a", "b"], "answer": 0}))
        with pytest.raises(PathNotAllowed, match="outside the folders this job was submitted under"):
            list(read_file(root / "data" / "sub" / "r.jsonl"))
        os.mkfifo(root / "data" / "fifo.jsonl")  # would block a plain open forever
        with pytest.raises(PathNotAllowed, match="not a regular file|no longer a regular file"):
            list(read_file(root / "data" / "fifo.jsonl"))
    assert list(read_file(root / "data" / "sub" / "r.jsonl"))  # outside a job, the command line reads anywhere


@pytest.mark.unit
def test_clone_and_resume_check_the_files_again_as_a_submit_does(tree):
    from jobs.store import JobStore
    from ui.jobs_page import clone_job, resume_job

    root, secret = tree
    ctx = LabContext(root)
    job = ctx.submit({"kind": "evaluate", "dataset": "custom", "data_files": [str(root / "data" / "q.jsonl")]})
    ctx.store.update(job.id, status="failed")
    _swap_for_link(root / "data" / "q.jsonl", secret / "secret.jsonl")
    with pytest.raises(PathNotAllowed):
        ctx.submit({"kind": "evaluate", "dataset": "custom", "data_files": [str(root / "data" / "q.jsonl")]})
    for attempt in (lambda: ctx.store.clone(job.id, roots=ctx.roots), lambda: ctx.store.resume(job.id, roots=ctx.roots),
                    lambda: JobStore(root).clone(job.id), lambda: JobStore(root).resume(job.id)):  # the CLI's too
        with pytest.raises(PathNotAllowed, match="leads outside"):
            attempt()
    assert "leads outside" in clone_job(ctx, job.id) and "leads outside" in resume_job(ctx, job.id)
    assert [j.id for j in ctx.store.list()] == [job.id] and ctx.store.get(job.id).status == "failed"


@pytest.mark.unit
def test_a_relative_model_path_outside_gets_one_answer_whether_or_not_it_exists(tree, monkeypatch):
    """``model: secret`` must not tell whether a folder ``secret`` exists outside the allowed folders."""
    root, secret = tree
    monkeypatch.chdir(secret.parent)  # ./secret exists here, outside runs/
    monkeypatch.setattr("lab.core.hub.hub_reachable", lambda: False)
    answers = []
    for name in ("secret", "missing", "secret/creds.csv", "missing/creds.csv"):
        with pytest.raises(ConfigError) as refused:
            parse_config({"kind": "evaluate", "model": name}, [root])
        answers.append(str(refused.value).replace(repr(name), "NAME"))
    assert len(set(answers)) == 1 and "leads outside" not in answers[0], answers


@pytest.mark.unit
def test_store_faults_are_answered_as_refusals_and_the_server_carries_on(tmp_path, monkeypatch):
    import sqlite3

    from jobs.store import JobStore
    from ui import forms
    from ui.api import job_status, submit_job
    from ui.launch_page import submit_form

    ctx = LabContext(tmp_path / "runs")
    job = ctx.submit({"kind": "evaluate"})

    def full(*args, **kwargs):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(JobStore, "_connect", full)
    said = submit_job(ctx, "kind: evaluate\n")
    assert not said["ok"] and "database or disk is full" in said["error"] and "free space" in said["error"]
    said = job_status(ctx, job.id)
    assert not said["ok"] and "database or disk is full" in said["error"]
    assert "database or disk is full" in submit_form(ctx, "evaluate", 0, 1, *forms.preset_values("evaluate", None))
    monkeypatch.undo()
    (tmp_path / "runs").chmod(0o500)  # read-only: a new run directory cannot be made
    try:
        said = submit_job(ctx, "kind: evaluate\n")
    finally:
        (tmp_path / "runs").chmod(0o700)
    assert os.geteuid() == 0 or (not said["ok"] and "cannot be used right now" in said["error"])
    assert job_status(ctx, job.id)["ok"]


@pytest.mark.unit
def test_a_job_that_ended_beside_a_full_disk_is_recorded_as_disk_full(tmp_path, monkeypatch):
    import collections

    import shutil

    from jobs import scheduler

    ctx = LabContext(tmp_path / "runs")
    job = ctx.submit({"kind": "evaluate"})
    ctx.store.update(job.id, status="running", started=1.0)
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 4096, 4096))
    ended = scheduler.finish(ctx.store, ctx.store.get(job.id), None)
    assert ended.status == "failed" and ended.error.startswith("disk full: 4,096 bytes free"), ended.error
