"""Plotly figures for the browser lab, built from plain dicts and DataFrames (no gradio, no torch),
one module per kind of figure.

Each figure function returns a ``go.Figure`` and never raises (:func:`ui.plots.common.never_raises`):
empty input gives an empty figure saying "no data", and input it cannot draw gives one saying why, so
one bad run cannot break a page.
"""
