"""The run directory's file names, in one place: the worker writes them, the scheduler, the
catalogue of runs (:mod:`lab.results.runs`) and the pages read them, and none of them spells a name.

    config.yaml        the resolved config (rerunning it reproduces the run)
    job.json           what it was queued with: resources, executor, and the folders it may read
    events.jsonl       what the worker reported, one JSON object a line
    log.txt            the worker's stdout and stderr
    result.json        how the worker ended: {"status": …, "error": …}
    STOP               present: the user asked the job to stop
    metrics.json       an evaluation's metrics (beside predictions.jsonl)
    predictions.jsonl  an evaluation's questions with every probability
    topk/manifest.json a top-k store (teacher extraction) and its coverage curve
    adapter/, model/   what a training run leaves: a LoRA adapter or full weights
    checkpoints/       the last checkpoints (per epoch, or every save_steps) a resumed run continues from
    tensorboard/       a training stage's TensorBoard event files (report_to: tensorboard)
    temperature.json   a fitted or chosen temperature
    ts/                the CFT pipeline's fitted temperature (the temperature lab reads it)
    compare.json       a comparison's answers (a compare job's; the compare page keeps its own
                       history in runs/comparisons/<time>-<question>/, its lane's log in runs/.lane/)
    report.json/.md    a pipeline's table (FIRST, CFT)
    done.json          a finished pipeline stage (a rerun skips it)
    label.txt          a name the user gave the run (the pages show it instead of the folder)
    eval/<model>-<set> a pipeline's evaluations
    start.json         what a chained stage's run:<id> fields named when it started (lab.jobkit.chain)
    start/<field>/     ... a LoRA run's adapter merged into its base, for a field that takes no adapter

The job store's folder holds ``jobs.db`` (:data:`STORE_FILE`, its index) beside the run directories.
A job's run directory is ``<runs>/<id, 5 digits or more>-<kind>`` (:data:`RUN_DIR_NAME`): the job
store names it so, and ``run:<id>`` finds it so.
"""
import re

CONFIG_FILE = "config.yaml"
JOB_FILE = "job.json"
EVENTS_FILE = "events.jsonl"
LOG_FILE = "log.txt"
RESULT_FILE = "result.json"
STOP_FILE = "STOP"
METRICS_FILE = "metrics.json"
PREDICTIONS_FILE = "predictions.jsonl"
TOPK_DIR = "topk"
TOPK_SHARD_SIZE = 1024  # sequences per top-k shard file (the default): the unit of resuming and of the ranks' split
MANIFEST_FILE = "manifest.json"
ADAPTER_DIR = "adapter"
MODEL_DIR = "model"
CHECKPOINTS_DIR = "checkpoints"
SNAPSHOTS_DIR = "snapshots"  # a training run's weights at every save, kept for a series over steps (snapshots/step-N/)
SERIES_FILE = "series.json"  # a series job's table: its points, cells and the means over seeds
SERIES_CSV = "series.csv"  # ... the same cells as a table
CALIBRATION_DIR = "calibration"  # an alignment run's (sft, dpo) evaluations during training: calibration/step-<n>/<task>/
CELLS_DIR = "cells"  # a series job's evaluations, one folder per (point, task)
TRACKER_DIR = "tensorboard"  # a training stage's TensorBoard event files, when report_to names it
TEMPERATURE_FILE = "temperature.json"
FITTED_TEMPERATURE_DIR = "ts"
CALIBRATOR_FILE = "calibrator.json"  # a recalibration fitted in the workbench (lab.calibration.calibrators)
CALIBRATORS_DIR = "calibrators"  # ... saved as runs/calibrators/<time>-<method>-<run>/
COMPARE_FILE = "compare.json"
COMPARISONS_DIR = "comparisons"  # the compare page's history: runs/comparisons/<time>-<question>/
LANE_DIR = ".lane"  # the inference lane's log (hidden: the catalogue never walks it)
REPORT_JSON = "report.json"
REPORT_MD = "report.md"
DONE_FILE = "done.json"
LABEL_FILE = "label.txt"
EVAL_DIR = "eval"
START_FILE = "start.json"
START_DIR = "start"
STORE_FILE = "jobs.db"  # the job store's table, in the folder that holds its run directories
RUN_DIR_NAME = re.compile(r"(\d{5,})-([a-z_]+)")  # 00042-evaluate: job 42's run directory


def run_dir_name(job_id: int, kind: str) -> str:
    """Job ``job_id``'s run directory name (:data:`RUN_DIR_NAME`), as the store and ``run:<id>`` know it."""
    return f"{job_id:05d}-{kind}"
