# syntax=docker/dockerfile:1
# attention-server image (DESIGN.md §12; deploy/README.md).
#
# Build stage: NVIDIA's CUDA 13 devel image on Ubuntu 24.04; scripts/image_build.sh (the
# recipe, also run on CI by tests/deploy/image_build_test.sh) installs the build dependencies
# with scripts/bootstrap.sh --no-python --cudnn (the same as on a Debian 12 developer machine,
# plus the cuDNN and cudnn-frontend headers pinned in scripts/cudnn_pins.txt), builds the server
# with scripts/build.sh's default configuration (CUDA archs 89;90a: L4 and Hopper; the cudnn
# backend compiled in, else the build fails) and gathers the binaries with every shared library
# they link that the runtime image lacks (scripts/bundle.sh), plus the pinned libcudnn.
# Runtime stage: the CUDA 13 runtime image (CUDA runtime, cuBLAS; no cuDNN of its own), the
# bundle and the pinned cuDNN on the loader path, a non-root user, configuration from ATTN_*
# environment variables (every flag has one: --kv-cache-bytes ↔ ATTN_KV_CACHE_BYTES; a flag
# given on the command line wins). `attention-server --version` prints the compiled backends.
# Ports: 50051 gRPC (attention.v1, TLS when configured), 8081 plaintext grpc.health.v1 only
# (kubelet probes cannot speak mTLS), 9464 Prometheus /metrics.
# The host needs an NVIDIA driver for CUDA 13 (R580+); the server checks it at start.
# No Docker engine runs in CI: this file is linted by hadolint and scanned by checkov
# (scripts/deploy_checks.sh); it has not been built here.
ARG CUDA_IMAGE_VERSION=13.0.1

FROM nvidia/cuda:${CUDA_IMAGE_VERSION}-devel-ubuntu24.04 AS build
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /src
# Dependencies first (their layer is reused while only the sources change).
COPY scripts/bootstrap.sh scripts/cudnn_pins.txt scripts/image_build.sh scripts/
RUN scripts/image_build.sh bootstrap && rm -rf /var/lib/apt/lists/*
COPY . .
RUN scripts/image_build.sh build /build /bundle

FROM nvidia/cuda:${CUDA_IMAGE_VERSION}-runtime-ubuntu24.04
COPY --from=build /bundle/bin/ /usr/local/bin/
COPY --from=build /bundle/lib/ /usr/local/lib/attention-server/
COPY --from=build /bundle/cudnn/ /usr/local/lib/attention-server/
COPY --from=build /bundle/share/ /usr/local/share/attention-server/
COPY client/data/ /usr/local/share/attention-server/data/
RUN echo /usr/local/lib/attention-server > /etc/ld.so.conf.d/attention-server.conf \
    && ldconfig \
    && useradd --system --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin attn
USER 10001:10001
ENV ATTN_LISTEN=0.0.0.0:50051 \
    ATTN_HEALTH_ADDRESS=0.0.0.0:8081 \
    ATTN_METRICS_ADDRESS=0.0.0.0:9464 \
    ATTN_LOG_FORMAT=json
EXPOSE 50051 8081 9464
# Kubernetes probes the plaintext health port with gRPC (deploy/k8s); Docker's own check is off.
HEALTHCHECK NONE
ENTRYPOINT ["/usr/local/bin/attention-server"]
