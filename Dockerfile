# syntax=docker/dockerfile:1
# The reactgate image: the gateway, the Ray head and the Ray workers all run it (k8s/). Build and
# push: see k8s/README.md. Pins here, in pyproject.toml and in k8s/raycluster.yaml (rayVersion) must
# agree — tests/test_image.py checks it, since Ray refuses a driver of another version.
ARG PYTHON_VERSION=3.11
ARG RAY_VERSION=2.60.0

# -- build: compilers only here ---------------------------------------------------------------------
FROM python:${PYTHON_VERSION}-slim-bookworm AS build
ARG RAY_VERSION
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY protocol protocol
COPY actors actors
COPY gateway gateway
COPY client client
# Ray with the `default` extra: KubeRay's probes talk to the dashboard agent it brings.
RUN python -m venv /opt/reactgate \
 && /opt/reactgate/bin/pip install --upgrade pip \
 && /opt/reactgate/bin/pip install "ray[default]==${RAY_VERSION}" . \
 && /opt/reactgate/bin/reactgate --help > /dev/null

# -- runtime: the virtualenv, a non-root user, nothing to compile with --------------------------------
FROM python:${PYTHON_VERSION}-slim-bookworm
COPY --from=build /opt/reactgate /opt/reactgate
ENV PATH=/opt/reactgate/bin:$PATH \
    HOME=/tmp \
    PYTHONUNBUFFERED=1 \
    LITELLM_LOCAL_MODEL_COST_MAP=True \
    RAY_USAGE_STATS_ENABLED=0
RUN groupadd --gid 10001 reactgate \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin reactgate
USER 10001:10001
WORKDIR /tmp
EXPOSE 8765
# k8s/ overrides the command per role (gateway, ray head, ray worker); alone, the image serves the demo.
CMD ["reactgate", "serve", "--backend", "local"]
