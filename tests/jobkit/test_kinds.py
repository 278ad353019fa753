"""Every registered job kind, introspected: its description is complete, its form renders with a
widget per field, the command line parses every field, the path and model checks reach every
declared path and model field (nested entries too), and pre-flight sees every model it loads."""
import dataclasses
import typing
from pathlib import Path

import gradio as gr
import pytest

from jobs import preflight
from lab.cli import build_parser, kinds_table, main
from lab.core.config import PATH_ROLES, ConfigError, ConfigMixin, doc, spec_of, unwrap_optional
from lab.jobkit import kinds
from lab.jobkit.kinds import parse_config
from lab.jobkit.sections import AdaptedModel, DataSection, EvalSection, RunSection
from ui import forms
from ui.context import LabContext
from ui.launch_page import build_launch, show_config

KINDS = [k.name for k in kinds.all_kinds()]
README = Path(__file__).resolve().parents[2] / "README.md"


def _entry_list(cls: type, name: str) -> bool:
    hint, _ = unwrap_optional(typing.get_type_hints(cls)[name])
    return typing.get_origin(hint) is list


def declared(cls: type, roles: tuple[str, ...], where: str = "") -> list[tuple[str, type, str]]:
    """(path, declaring class, field) of every field with one of ``roles``, found from the dataclass
    declarations alone (not lab.core.config.walk, which the checks use): entries of a list as ``[0]``."""
    out = []
    for f in dataclasses.fields(cls):
        spec, path = spec_of(f), f"{where}.{f.name}" if where else f.name
        if spec.role in roles:
            out.append((path, cls, f.name))
        if spec.entries is not None:
            inner = f"{path}[0]" if _entry_list(cls, f.name) else path
            out += [(p, c, n) for p, c, n in declared(spec.entries, roles, inner)
                    if n not in spec.exclude]
    return out


def _set(config: dict, path: str, value) -> dict:
    """``config`` with ``value`` at ``path`` (``a``, ``a[0].b``, ``a.b``), entries created as needed."""
    head, _, rest = path.partition(".")
    name, index = (head[:-3], 0) if head.endswith("[0]") else (head, None)
    if index is None and not rest:
        return {**config, name: value}
    if index is None:
        return {**config, name: _set(dict(config.get(name) or {}), rest, value)}
    entry = {"dataset": "custom", "model": "bundled"}
    entry = {k: v for k, v in entry.items() if k in _entry_fields(config["kind"], name)}
    return {**config, name: [_set(entry, rest, value) if rest else value]}


def _entry_fields(kind: str, name: str) -> set[str]:
    spec = spec_of(kinds.get(kind).config.__dataclass_fields__[name])
    return {f.name for f in dataclasses.fields(spec.entries)} - set(spec.exclude)


def _base(kind: str) -> dict:
    return {"kind": kind, **({"question": "Which is it?"} if kind == "compare" else {})}


@pytest.mark.unit
@pytest.mark.parametrize("kind", KINDS)
def test_the_description_is_complete(kind):
    description = kinds.get(kind)
    assert description.description and description.outputs and description.key_fields
    assert set(description.key_fields) <= {f.name for f in dataclasses.fields(description.config)}
    assert description.config.__module__.startswith("lab.")


@pytest.fixture(scope="module")
def launch_page(tmp_path_factory) -> tuple[LabContext, set]:
    """The Launch page built once, every kind's form on it (about 4 s a build), and its widgets' ids."""
    ctx = LabContext(tmp_path_factory.mktemp("launch") / "runs")
    with gr.Blocks() as demo:
        build_launch(ctx)
    return ctx, {getattr(block, "elem_id", None) for block in demo.blocks.values()}


@pytest.mark.unit
@pytest.mark.parametrize("kind", KINDS)
def test_the_form_renders_a_widget_for_every_field_and_shows_a_config(kind, launch_page):
    ctx, ids = launch_page
    names = [f.name for f in dataclasses.fields(kinds.get(kind).config)]
    assert {f"{kind}-{n}" for n in names} <= ids and f"submit-{kind}" in ids
    assert [f.name for f in forms.fields(kind)][: len(kinds.get(kind).key_fields)] == list(kinds.get(kind).key_fields)
    values = forms.preset_values(kind, None)
    if kind == "compare":
        values[[f.name for f in forms.fields(kind)].index("question")] = "Which is it?"
    message, yaml_box = show_config(ctx, kind, *values)
    assert message == "" and yaml_box["visible"] and f"kind: {kind}" in yaml_box["value"]


@pytest.mark.unit
@pytest.mark.parametrize("kind", KINDS)
def test_the_cli_has_a_flag_for_every_field(kind, capsys):
    cls = kinds.get(kind).config
    parser = build_parser()
    sub = parser._subparsers._group_actions[0].choices[kind]  # argparse keeps its subparsers here
    flags = {a.dest: a.option_strings for a in sub._actions}
    for f in dataclasses.fields(cls):
        assert flags[f.name][0] == f"--{f.name.replace('_', '-')}"
    assert vars(parser.parse_args([kind])) == {"command": kind, "out": None}  # unset flags keep the defaults


@pytest.mark.unit
def test_cli_flags_reach_the_config_for_every_value_shape():
    args = vars(build_parser().parse_args([
        "first", "--students", "first", "distill", "--no-kd-tail", "--k", "7", "--ts-form", "logit",
        "--training", "{epochs: 1}", "--teacher-epochs", "2.5"]))
    args.pop("command"), args.pop("out")
    _, cfg = parse_config({"kind": "first", **args})
    assert (cfg.students, cfg.kd_tail, cfg.k, cfg.ts_form, cfg.training, cfg.teacher_epochs) == (
        ["first", "distill"], False, 7, "logit", {"epochs": 1}, 2.5)


@pytest.mark.unit
def test_an_old_shape_key_is_refused_with_the_new_key_named(capsys):
    with pytest.raises(ConfigError, match=r"^epochs: this key moved: write it as training.epochs"):
        parse_config({"kind": "first", "epochs": 2})
    with pytest.raises(ConfigError, match=r"^ood\[0\].n: this key moved: write it as limit"):
        parse_config({"kind": "cft", "ood": [{"dataset": "arc_challenge", "n": 5}]})
    assert main(["cft", "--ood", "[{dataset: arc_challenge, n: 5}]"]) == 2
    assert "ood[0].n: this key moved: write it as limit" in capsys.readouterr().err


@pytest.mark.unit
@pytest.mark.parametrize("kind", KINDS)
def test_the_path_and_model_checks_reach_every_declared_field(kind, tmp_path):
    roots = [tmp_path / "runs"]
    roots[0].mkdir()
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "q.jsonl").write_text('{"question": "2+2?", "choices": ["4", "5"], "answer": "A"}\n')
    fields = declared(kinds.get(kind).config, PATH_ROLES)
    assert fields, f"{kind} declares no path or model field"
    for path, _, _ in fields:
        with pytest.raises(ConfigError) as refused:
            parse_config(_set(_base(kind), path, str(outside / "q.jsonl")), roots)
        assert str(refused.value).startswith(path), (path, str(refused.value))


@pytest.mark.model
@pytest.mark.parametrize("kind", KINDS)
def test_preflight_sees_every_model_the_kind_loads(kind, bundled):
    models = [path for path, _, _ in declared(kinds.get(kind).config, ("model",))]
    config = _base(kind)
    for path in models:
        config = _set(config, path, "bundled")
    if kind == "series":  # an entry is a model or a training config, never both: one entry each
        config["models"] = [{"model": "bundled"}, {"train": {"model": "bundled"}}]
        models = [path.replace("models[0].train", "models[1].train") for path in models]
    _, cfg = parse_config(config)
    resolved = cfg.to_dict()
    seen = {path: method for path, _, method in preflight.models(kind, resolved)}
    assert set(seen) == set(models)
    warnings = preflight.check(kind, resolved, (0,), free={0: 1.0})
    assert len(warnings) == len(models) and all(w.split(":")[0] in seen for w in warnings)
    trained = {"finetune": {"model": "full"}, "sft": {"model": "full"}, "dpo": {"model": "full"},
               "first": {"teacher": "full", "student": "full"},
               "cft": {"model": "full"}, "series": {"models[1].train.model": "full"}}.get(kind, {})
    assert seen == {p: trained.get(p, "inference") for p in seen}


@pytest.mark.unit
def test_preflight_follows_the_training_method_of_each_model():
    _, cfg = parse_config({"kind": "first", "teacher_method": "lora", "student_method": "qlora"})
    assert dict((p, m) for p, _, m in preflight.models("first", cfg.to_dict())) == {"teacher": "lora",
                                                                                   "student": "qlora"}
    _, cfg = parse_config({"kind": "cft", "training": {"method": "lora"}})
    assert [m for _, _, m in preflight.models("cft", cfg.to_dict())] == ["lora"]


@pytest.mark.unit
def test_the_readme_table_of_kinds_is_the_registry(capsys):
    assert main(["kinds"]) == 0
    table = capsys.readouterr().out.strip()
    assert table == kinds_table() and table in README.read_text(encoding="utf-8")
    assert [line.split("`")[1] for line in table.splitlines()[2:]] == KINDS


@dataclasses.dataclass
class _SweepBinsConfig(ConfigMixin, RunSection, EvalSection, DataSection, AdaptedModel):
    max_bins: int = dataclasses.field(default=30, metadata=doc("largest bin count", ge=2, le=1000))


def _run_sweep_bins(cfg: _SweepBinsConfig, ctx) -> dict:
    return {"max_bins": cfg.max_bins}


@pytest.mark.model
def test_a_kind_defined_in_one_module_gets_form_cli_checks_and_preflight(monkeypatch, tmp_path, bundled):
    """The README's example: one config, one runner, one registration; everything else follows."""
    kind = kinds.JobKind("sweep_bins", "ECE against the number of bins", _SweepBinsConfig,
                         f"{__name__}:_run_sweep_bins", outputs=("bins.json",),
                         key_fields=("model", "dataset", "max_bins"))
    monkeypatch.setitem(kinds.KINDS._items, "sweep_bins", kind)
    assert [f.name for f in forms.fields("sweep_bins")][:3] == ["model", "dataset", "max_bins"]
    args = vars(build_parser().parse_args(["sweep_bins", "--max-bins", "20", "--data-files", "a.jsonl"]))
    assert (args["max_bins"], args["data_files"]) == (20, ["a.jsonl"])
    with pytest.raises(ConfigError, match=r"^max_bins: must be an integer ≥ 2"):
        parse_config({"kind": "sweep_bins", "max_bins": 1})
    (tmp_path / "runs").mkdir()
    with pytest.raises(ConfigError, match=r"^data_files\[0\]: .* outside the folders"):
        parse_config({"kind": "sweep_bins", "data_files": [str(tmp_path / "q.jsonl")]}, [tmp_path / "runs"])
    _, cfg = parse_config({"kind": "sweep_bins"})
    assert [p for p, _, _ in preflight.models("sweep_bins", cfg.to_dict())] == ["model"]
    assert "`sweep_bins`" in kinds_table()
    assert kind.run(cfg, None) == {"max_bins": 30}  # the runner, imported from its dotted path


@pytest.mark.unit
def test_a_runner_must_be_named_by_its_dotted_path():
    with pytest.raises(ValueError, match="runner must be 'package.module:function'"):
        kinds.register(kinds.JobKind("bad", "a runner given as a function", _SweepBinsConfig, lambda cfg, ctx: {}, ()))
