"""The whole browser lab: one tab per page, each page built by its own module."""
from __future__ import annotations

import gradio as gr

from ui.api import API_NAMES, register_api
from ui.cases_page import build_cases
from ui.compare_page import build_compare
from ui.context import LabContext
from ui.jobs_page import build_jobs
from ui.knowledge_page import build_knowledge
from ui.launch_page import build_launch
from ui.reliability_page import build_reliability
from ui.results_page import build_results
from ui.temperature_page import build_temperature

PAGES = (("Launch", "launch", build_launch), ("Jobs", "jobs", build_jobs), ("Reliability", "reliability", build_reliability),
         ("Temperature lab", "temperature", build_temperature), ("Case studies", "cases", build_cases),
         ("Compare models", "compare", build_compare), ("Knowledge", "knowledge", build_knowledge),
         ("Results", "results", build_results))


def build(ctx: LabContext) -> gr.Blocks:
    with gr.Blocks(title="Calibration Lab") as demo:
        gr.Markdown("# Calibration Lab\nHow accurate is a model, and how honest is its confidence?")
        with gr.Tabs():
            for title, tab_id, build_page in PAGES:
                with gr.Tab(title, id=tab_id):
                    build_page(ctx)
        register_api(ctx)
    # The pages' own events (uploads, sliders, the loaders of callable values) are not an API:
    # only the documented endpoints may be called by a client.
    for fn in demo.fns.values():
        if fn.api_name not in API_NAMES:
            fn.api_visibility = "private"
    return demo
