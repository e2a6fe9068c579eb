# syntax=docker/dockerfile:1
# The coordinator: FastAPI + SQLAlchemy + numpy, no torch. Build from the repository root:
#   docker build -f deploy/coordinator.Dockerfile -t fedprompt-coordinator:0.1.0 .
# Secrets are never baked in: mount them as files and point FEDPROMPT_SECRETS_DIR at the folder.
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm
# checkov reads FROM ${PYTHON_IMAGE} without the ARG's default, a pinned tag:
# checkov:skip=CKV_DOCKER_7:the base image is the ARG PYTHON_IMAGE, whose default is the exact tag python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/fedprompt
WORKDIR /src
COPY pyproject.toml constraints.txt README.md ./
COPY fedprompt ./fedprompt
COPY coordinator ./coordinator
COPY shared ./shared
COPY migrations ./migrations
COPY worker ./worker
COPY sim ./sim
# The package without extras: the coordinator's own dependencies, pinned by constraints.txt.
RUN /opt/fedprompt/bin/pip install --no-compile -c constraints.txt . \
    && if /opt/fedprompt/bin/python -c "import torch" 2>/dev/null; then echo "torch in the coordinator image" >&2; exit 1; fi

FROM ${PYTHON_IMAGE}
RUN groupadd --system --gid 10001 fedprompt \
    && useradd --system --no-log-init --uid 10001 --gid fedprompt --home-dir /var/lib/fedprompt --create-home fedprompt
COPY --from=build /opt/fedprompt /opt/fedprompt
ENV PATH=/opt/fedprompt/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    FEDPROMPT_DATA_DIR=/var/lib/fedprompt \
    FEDPROMPT_HOST=0.0.0.0 \
    FEDPROMPT_PORT=8000 \
    FEDPROMPT_LOG_FORMAT=json
USER 10001:10001
WORKDIR /var/lib/fedprompt
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request as u; u.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('FEDPROMPT_PORT', '8000'), timeout=4)"]
# `serve` applies pending migrations (under a Postgres advisory lock) before it listens;
# `migrate` alone is the one-shot job of compose.yaml and the Kubernetes Job.
ENTRYPOINT ["fedprompt-coordinator"]
CMD ["serve"]
