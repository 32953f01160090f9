# Redis, Apache Ignite and Prometheus on the same Debian base as the service
# images, for machines that cannot pull images (make compose-test builds them).
# The context is a folder scripts/compose-test.sh lays out: scripts/backends/
# (ignite.sh, common.sh) and deploy/ignite/target/ (the launcher Maven built).
#   docker build -f deploy/docker/backends.Dockerfile --target redis CONTEXT
# Each server's address and ports come from its command line (compose sets them).
# hadolint global ignore=DL3008
ARG BASE_IMAGE=debian:bookworm-slim

FROM ${BASE_IMAGE} AS redis
# Debian's redis-server; the compose command names the port and the data folder.
RUN apt-get update && apt-get install -y --no-install-recommends redis-server \
 && rm -rf /var/lib/apt/lists/* && install -d /data
WORKDIR /data
ENTRYPOINT ["redis-server"]

FROM ${BASE_IMAGE} AS ignite
# Ignite 2.16's jars through Maven (deploy/ignite), run by the same launcher the
# tests use: one in-memory node, persistence off, thin clients on the client port.
RUN apt-get update && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
 && rm -rf /var/lib/apt/lists/*
COPY scripts/backends /opt/stalwart/scripts/backends
COPY deploy/ignite/target /opt/stalwart/deploy/ignite/target
ENTRYPOINT ["bash", "/opt/stalwart/scripts/backends/ignite.sh", "run", "/var/lib/ignite"]

FROM ${BASE_IMAGE} AS prometheus
# Debian's Prometheus; compose mounts the configuration.
RUN apt-get update && apt-get install -y --no-install-recommends prometheus \
 && rm -rf /var/lib/apt/lists/* && install -d /prometheus
ENTRYPOINT ["/usr/bin/prometheus"]
