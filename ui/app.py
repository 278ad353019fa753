"""The whole browser lab: one tab per page, each page built by its own module."""
from __future__ import annotations

import gradio as gr

from ui.api import register_api
from ui.compare_page import build_compare
from ui.context import LabContext
from ui.explore_pages import build_cases, build_knowledge, build_reliability, build_results, build_temperature
from ui.jobs_page import build_jobs
from ui.launch_page import build_launch

CSS = """
.lab-error { color: #b00020; background: #fdecea; border-radius: 6px; padding: 8px 12px; }
.lab-ok { color: #1b5e20; background: #e8f5e9; border-radius: 6px; padding: 8px 12px; }
"""


def build(ctx: LabContext) -> gr.Blocks:
    with gr.Blocks(title="Calibration Lab") as demo:
        gr.Markdown("# Calibration Lab\nHow accurate is a model, and how honest is its confidence?")
        with gr.Tabs():
            with gr.Tab("Launch", id="launch"):
                build_launch(ctx)
            with gr.Tab("Jobs", id="jobs"):
                build_jobs(ctx)
            with gr.Tab("Reliability", id="reliability"):
                build_reliability(ctx)
            with gr.Tab("Temperature lab", id="temperature"):
                build_temperature(ctx)
            with gr.Tab("Case studies", id="cases"):
                build_cases(ctx)
            with gr.Tab("Compare models", id="compare"):
                build_compare(ctx)
            with gr.Tab("Knowledge", id="knowledge"):
                build_knowledge(ctx)
            with gr.Tab("Results", id="results"):
                build_results(ctx)
        register_api(ctx)
    return demo
