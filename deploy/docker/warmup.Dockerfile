# syntax=docker/dockerfile:1
# `warmup`: compile a job's programs for a cluster topology and fill the shared cache (deploy/README.md).
# Build from the repository root:
#   docker build -f deploy/docker/warmup.Dockerfile -t jaxcache-warmup:0.1.0 .
# Warm-up must run the training job's exact JAX, jaxlib and model code, or the cache keys will not match: build
# the training image FROM this one (adding the model code), or install the same ./core,
# ./client[cuda12,gcs,s3,azure] and ./warmup into it.

# The CUDA base brings the NVIDIA container runtime's settings (NVIDIA_VISIBLE_DEVICES, driver capabilities);
# the CUDA libraries themselves come from jax[cuda12]'s pip wheels, so the small `base` flavour is enough.
# Both stages must use the same base image (tests/test_deploy.py checks): the venv's python is a symlink into it.
FROM nvidia/cuda:12.8.0-base-ubuntu24.04 AS build
# hadolint's DL3008 asks for pinned apt versions: the base image tag already pins the Ubuntu release, and pinning
# exact package versions breaks the build whenever Ubuntu publishes a security update of them.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/jaxcache
WORKDIR /src
# The core, the client (which configures JAX as jobs do) and warm-up; no service. Every store's extra (gs://, s3://,
# az:// roots, JAX's fsspec filesystems with them), in one pip call: s3fs's aiobotocore pins boto3's botocore.
COPY core ./core
COPY client ./client
COPY warmup ./warmup
RUN /opt/jaxcache/bin/pip install --no-cache-dir './core[gcs,s3,azure]' './client[cuda12,gcs,s3,azure]' ./warmup

FROM nvidia/cuda:12.8.0-base-ubuntu24.04
# The venv's python is a symlink to the system python3, so the runtime stage needs the same package (DL3008: as
# above).
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 \
 && rm -rf /var/lib/apt/lists/*
# Ubuntu 24.04 images ship a user 1000 (ubuntu); a fixed high uid of our own avoids colliding with it.
RUN groupadd --system --gid 10001 jaxcache \
 && useradd --system --no-log-init --uid 10001 --gid 10001 --home-dir /home/jaxcache --create-home \
      --shell /usr/sbin/nologin jaxcache
COPY --from=build /opt/jaxcache /opt/jaxcache
ENV PATH=/opt/jaxcache/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
WORKDIR /home/jaxcache
# checkov:skip=CKV_DOCKER_2: warm-up runs to completion and exits; there is no server whose health could be probed.
ENTRYPOINT ["warmup"]
