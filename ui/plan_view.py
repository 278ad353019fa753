"""The Launch form's **Plan** answer: what a job would hold per GPU, in host memory and on disk, before it is
queued or its models downloaded (:func:`jobs.preflight.dry_run`, the same report as
``python -m jobs submit CONFIG --gpus N --dry-run``), as a table beside the form."""
from __future__ import annotations

import html
from pathlib import Path
from typing import Any, Iterable, Optional

from jobs.preflight import GIB, dry_run, free_gpu_memory
from lab.core.reads import shown
from ui.messages import note

DEFAULT_GPU_GIB = 80  # a GPU to plan for on a machine without one: an H100's or A100's memory, as the CLI's default


def gpu_budget(free: Optional[dict[int, float]] = None) -> tuple[float, str]:
    """Bytes of one GPU to plan against, and how the table says it: the least free on this machine's GPUs, or
    :data:`DEFAULT_GPU_GIB` where there are none."""
    free = free_gpu_memory() if free is None else free
    if free:
        least = min(free.values())
        return least, f"{least / GIB:.1f} GiB free on the least free of this machine's {len(free)} GPU(s)"
    return DEFAULT_GPU_GIB * GIB, f"a {DEFAULT_GPU_GIB} GiB GPU (this machine has none)"


def _cell(value: Any) -> str:
    return html.escape(str(value))


def _model(name: str, roots: Optional[Iterable[Path]]) -> str:
    """A model as the page names it: a folder by the allowed folder holding it (never the server's path), a hub id
    or a named model as given."""
    return shown(name, roots) if Path(name).is_absolute() else name


def plan_html(kind: str, config: dict[str, Any], gpus: int, roots: Optional[Iterable[Path]] = None,
              free: Optional[dict[int, float]] = None) -> str:
    """The dry run of ``config`` on ``gpus`` GPUs as HTML: a row per model, what does not fit and what would;
    model folders named from ``roots`` (the server's allowed folders)."""
    budget, against = gpu_budget(free)
    report = dry_run(kind, config, gpus, budget)
    rows, advice = [], []
    for m in report["models"]:
        if m.get("n_params") is None:
            rows.append(f"<tr><td>{_cell(m['field'])}</td><td>{_cell(_model(m['model'], roots))}</td>"
                        f"<td colspan='5'>{_cell(m['unknown'])}</td></tr>")
            continue
        per_gpu = f"{m['per_gpu_gib']:.2f}" if gpus else "(CPU job)"
        fits = "yes" if m["fits"] else "<b>no</b>"
        rows.append(f"<tr><td>{_cell(m['field'])}</td><td>{_cell(_model(m['model'], roots))} ({m['n_params'] / 1e9:.2f} B, "
                    f"{_cell(m['method'])})</td><td>{per_gpu}</td><td>{m['cpu_gib']:.2f}</td><td>{m['disk_gib']:.2f}"
                    f"</td><td>{fits if gpus else '-'}</td><td>{m['replicated_per_gpu_gib']:.2f}</td></tr>")
        advice += [f"{m['field']}: {item}" for item in m.get("advice", [])]
    head = ("<tr><th>field</th><th>model</th><th>GiB per GPU</th><th>host GiB</th><th>disk GiB</th><th>fits</th>"
            "<th>GiB per GPU, unsharded</th></tr>")
    table = f"<table class='lab-plan'>{head}{''.join(rows)}</table>"
    said = (f"Plan for {gpus} GPU(s) against {against}, nothing queued or downloaded; the job's checkpoints and "
            f"weights need {report['disk_gib']:.2f} GiB of disk at once. GPU figures include the CUDA context.")
    return note(said) + table + "".join(note(f"To fit, {item}") for item in advice)
