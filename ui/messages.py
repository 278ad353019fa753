"""The one-line messages pages show: escaped, so text from a config, a file or an error message
(which may hold a user's input) is shown as text, never interpreted as markup."""
from __future__ import annotations

import html
import os
import sqlite3
from pathlib import Path
from typing import Iterable, Optional

from lab.core.reads import shown_in
from lab.data import samples

CSS = """
.lab-error { color: #b00020; background: #fdecea; border-radius: 6px; padding: 8px 12px; }
.lab-ok { color: #1b5e20; background: #e8f5e9; border-radius: 6px; padding: 8px 12px; }
.lab-note { color: #5d4037; background: #fff8e1; border-radius: 6px; padding: 8px 12px; }
/* opaque, and above the form's labels (gradio lifts a block's label onto a layer of its own) */
.lab-submit-bar { position: sticky; bottom: 0; z-index: 1000; isolation: isolate;
                  background: var(--background-fill-primary, #fff) !important;
                  padding: 8px 0; border-top: 1px solid var(--border-color-primary); }
.lab-submit-bar .lab-error, .lab-submit-bar .lab-ok, .lab-submit-bar .lab-note { max-height: 25vh; overflow: auto; }
.lab-refused { box-shadow: inset 0 0 0 2px #b00020 !important; --block-info-text-color: #b00020; }
/* a table header wraps between words, never inside one ("confide nce"): its column is at least a word wide */
th.header-cell span.header { word-break: normal !important; overflow-wrap: normal !important; }
/* a dropdown's chosen text stops before its arrow ("Sort by": "dataset, then confidence…") */
.secondary-wrap input[role="combobox"] { padding-right: 28px !important; text-overflow: ellipsis; }
/* a box the browser's own scripts fill (the Life cycle plot's clicks): in the page, never seen */
.lab-hidden { display: none !important; }
/* gradio clips its container with overflow: hidden, which also stops a sticky bar; clip does not */
.gradio-container { overflow: clip !important; }
"""


def error(message: str) -> str:
    return f"<div class='lab-error'>⚠️ {html.escape(message)}</div>"


def refusal(shown: str) -> str | None:
    """The text of a message :func:`error` made (None for any other): what a page reads back to
    mark the field a refusal names."""
    head, tail = "<div class='lab-error'>⚠️ ", "</div>"
    return html.unescape(shown[len(head):-len(tail)]) if shown.startswith(head) and shown.endswith(tail) else None


def ok(message: str) -> str:
    return f"<div class='lab-ok'>✅ {html.escape(message)}</div>"


def note(message: str) -> str:
    """A caution that does not stop anything (a small sample, an optimistic figure)."""
    return f"<div class='lab-note'>ℹ️ {html.escape(message)}</div>"


# The job store's file or the run directories failing under a request: a full disk, a read-only
# folder. The caller is told so, as for any refusal; the server itself carries on.
STORE_FAULTS = (sqlite3.Error, OSError)


def server_free(text: Optional[str], roots: Iterable[Path]) -> str:
    """A text the lab did not word for a page (a job's error, written by a worker whatever raised it;
    a library's OSError) as a page or the API shows it: each of the server's folders (``roots``, the
    package's bundled samples) named by its own name, never by where it lies on the server."""
    return shown_in(text or "", [*roots, samples.ROOT])


def store_fault(runs: Path, e: BaseException) -> str:
    """One line (plain text) on a job store that cannot be used right now, with what to do. The runs
    folder by its own name: an OSError's text, and the folder's path, are the server's, not the user's."""
    what = getattr(e, "strerror", None) or (type(e).__name__ if isinstance(e, OSError) else str(e)) or type(e).__name__
    return (f"the job store in {Path(os.path.abspath(runs)).name}/ cannot be used right now ({what}); check that its "
            "disk has free space and that the server may write there, then try again")
