"""Browser UI helpers (plotly figures) for the Calibration Lab."""
