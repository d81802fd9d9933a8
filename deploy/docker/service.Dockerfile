# syntax=docker/dockerfile:1
# The catalog service, `jaxcache serve`. Build from the repository root:
#   docker build -f deploy/docker/service.Dockerfile -t jaxcache-service:0.1.0 .
# Configure it with JAXCACHE_* environment variables (docs/operator-guide.md, "Settings"); Kubernetes manifests in deploy/k8s/.

# Both stages must use the same base image (tests/test_deploy.py checks): the venv built in the first is copied
# into the second, and its bin/python is a symlink to the base image's interpreter.
FROM python:3.11-slim-bookworm AS build
RUN python -m venv /opt/jaxcache
WORKDIR /src
# Only the core and the service: the service never imports JAX, so the image carries none (no jax, no jaxlib).
# Every store's client library (gs://, s3://, az:// roots), in one pip call: s3's boto3 must resolve with the rest.
COPY core ./core
COPY service ./service
# The service brings the PostgreSQL driver (psycopg, binary wheel: no libpq to install) and Alembic with the
# catalog's migrations (package data under jaxcache/service/catalog/migrations/).
RUN /opt/jaxcache/bin/pip install --no-cache-dir './core[gcs,s3,azure]' ./service

FROM python:3.11-slim-bookworm
# A fixed numeric uid/gid so Kubernetes' runAsNonRoot can verify the user without reading /etc/passwd.
RUN groupadd --system --gid 10001 jaxcache \
 && useradd --system --no-log-init --uid 10001 --gid 10001 --home-dir /var/lib/jaxcache --create-home \
      --shell /usr/sbin/nologin jaxcache
COPY --from=build /opt/jaxcache /opt/jaxcache
# A container is reached from outside its own loopback, so listen on every address; `serve` still refuses to
# start without tokens there (JAXCACHE_TOKENS or JAXCACHE_TOKENS_FILE). XDG_STATE_HOME is where the default
# SQLite catalog goes when JAXCACHE_DB is unset: a volume in Kubernetes, where the root filesystem is read-only.
ENV PATH=/opt/jaxcache/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    XDG_STATE_HOME=/var/lib/jaxcache \
    JAXCACHE_HOST=0.0.0.0 \
    JAXCACHE_PORT=8080
USER 10001:10001
WORKDIR /var/lib/jaxcache
EXPOSE 8080
# The slim image has no curl: probe with the interpreter that is there anyway. /healthz needs no token.
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('JAXCACHE_PORT', '8080') + '/healthz', timeout=4)"]
ENTRYPOINT ["jaxcache", "serve"]
