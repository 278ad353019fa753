"""The temperature lab's log slider and its T box: T to and from a slider position on its step grid,
the range the slider spans, and which typed T or position is taken.

gradio's slider is linear, and a sweep may span five decades: the slider moves log10 T, so every
decade gets the same length of track, and the box beside it shows and takes T itself.
"""
from __future__ import annotations

import math
from typing import Any, Optional

import gradio as gr

from lab.results import analysis

SYMBOL = {"logit": "T", "paper": "c"}  # what each form calls its parameter
FIELD = {"logit": "Temperature T", "paper": "Scale c"}  # ... and the box that takes it
STEPS_PER_DECADE = 1000  # the slider's step in log10 T: a factor 1.0023, finer than the 4 digits a move shows
SHOWN_DIGITS = 4  # significant digits of a T read off the slider: the step cannot tell finer ones apart
BOX_DIGITS = 6  # ... and of the T the box shows (an optimum is dialled exactly: the state keeps every digit)
LIMITS = (1e-6, 1e6)  # a typed T outside is refused: rows are one-hot or uniform long before, and floats overflow


def to_slider(t: float) -> float:
    """The slider's position for T: log10 T, so that every decade gets the same length of track."""
    return math.log10(t)


def from_slider(position: float) -> float:
    """T at a slider position, to :data:`SHOWN_DIGITS` significant digits ("2.512", not 2.51188643)."""
    return float(f"{10 ** position:.{SHOWN_DIGITS}g}")


def _on_grid(position: float, rounding: Any = round) -> float:
    """A slider position on the slider's step grid (``math.floor``/``ceil`` to take a bound outward)."""
    return rounding(round(position * STEPS_PER_DECADE, 6)) / STEPS_PER_DECADE


def thumb(t: float) -> float:
    """Where the slider's thumb sits for T: its position on the step grid."""
    return _on_grid(to_slider(t))


def box_text(t: float) -> str:
    """T as the box shows it, to :data:`BOX_DIGITS` significant digits."""
    return f"{t:.{BOX_DIGITS}g}"


def _number(value: Any) -> Optional[float]:
    """A finite float from a number or its text, else None (True is no temperature)."""
    if isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def positive(value: Any) -> Optional[float]:
    """A finite positive float from a number or its text, else None: what a temperature may be."""
    number = _number(value)
    return number if number is not None and number > 0 else None


def parse_temperature(value: Any, form: str) -> float:
    """A typed T (or c): a finite number inside :data:`LIMITS`; a ValueError naming the box otherwise."""
    t = positive(value)
    if t is None:
        raise ValueError(f"{FIELD[form]}: expected a positive number such as 1.5, but got {value!r}")
    if not LIMITS[0] <= t <= LIMITS[1]:
        raise ValueError(f"{FIELD[form]}: expected a value from {LIMITS[0]:g} to {LIMITS[1]:g}, but got {value!r}")
    return t


def parse_position(value: Any, form: str) -> float:
    """T at a slider position the browser sent (it may be typed, out of the slider's range: that is
    taken, the range follows); a ValueError naming the slider for a position past :data:`LIMITS`."""
    position, low, high = _number(value), to_slider(LIMITS[0]), to_slider(LIMITS[1])
    if position is None or not low <= position <= high:
        raise ValueError(f"{FIELD[form]} slider: expected log₁₀ {SYMBOL[form]} from {low:g} to {high:g}, "
                         f"but got {value!r}")
    return from_slider(position)


def slider_span(sweep: analysis.Sweep, t: float) -> tuple[float, float]:
    """The temperatures the slider spans: the sweep's after any widening, so that every optimum it
    reports can be dialled, stretched to hold ``t``."""
    temperatures = sweep.table["temperature"]
    return min(float(temperatures.min()), t), max(float(temperatures.max()), t)


def slider_settings(low: float, high: float, t: float, form: str) -> dict[str, Any]:
    """The log slider over at least [low, high] (bounds taken outward onto its step grid), the thumb
    at T, the label saying it is log-scaled and showing T: keyword arguments of ``gr.Slider``."""
    symbol = SYMBOL[form]
    bottom, top = _on_grid(to_slider(low), math.floor), _on_grid(to_slider(high), math.ceil)
    label = (f"{FIELD[form]} on a log scale (the track is log₁₀ {symbol}): {symbol} = {t:.{SHOWN_DIGITS}g}, "
             f"from {10 ** bottom:.3g} to {10 ** top:.3g}")
    return {"minimum": bottom, "maximum": top, "step": 1 / STEPS_PER_DECADE, "label": label,
            "value": thumb(t)}


def slider_update(low: float, high: float, t: float, form: str, move: bool = True) -> dict[str, Any]:
    """:func:`slider_settings` as an update; ``move=False`` leaves the thumb alone: while the user
    drags it, an answer to an earlier position would pull it back."""
    settings = slider_settings(low, high, t, form)
    if not move:
        del settings["value"]
    return gr.update(**settings)
