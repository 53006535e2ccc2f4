# syntax=docker/dockerfile:1
# attention-server image (DESIGN.md §12; deploy/README.md).
#
# Build stage: NVIDIA's CUDA 13 + cuDNN devel image on Ubuntu 24.04; scripts/bootstrap.sh
# installs the same build dependencies as on a Debian 12 developer machine (CI runs it on every
# build), CMake builds the server for L4 (sm_89) and Hopper (sm_90a), and scripts/bundle.sh
# gathers the binaries with every shared library they link that the runtime image lacks.
# Runtime stage: the CUDA 13 + cuDNN runtime image (CUDA runtime, cuBLAS, cuDNN), the bundle,
# a non-root user, configuration from ATTN_* environment variables (every flag has one:
# --kv-cache-bytes ↔ ATTN_KV_CACHE_BYTES; a flag given on the command line wins).
# Ports: 50051 gRPC (attention.v1, TLS when configured), 8081 plaintext grpc.health.v1 only
# (kubelet probes cannot speak mTLS), 9464 Prometheus /metrics.
# The host needs an NVIDIA driver for CUDA 13 (R580+); the server checks it at start.
# No Docker engine runs in CI: this file is linted by hadolint and scanned by checkov
# (scripts/deploy_checks.sh); it has not been built here.
ARG CUDA_IMAGE_VERSION=13.0.1

FROM nvidia/cuda:${CUDA_IMAGE_VERSION}-cudnn-devel-ubuntu24.04 AS build
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /src
# Dependencies first (their layer is reused while only the sources change).
COPY scripts/bootstrap.sh scripts/bootstrap.sh
RUN scripts/bootstrap.sh --no-python && rm -rf /var/lib/apt/lists/*
COPY . .
RUN cmake -S . -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release -DATTN_TESTS=OFF \
      -DCMAKE_CUDA_ARCHITECTURES="89;90a" \
    && cmake --build /build -j"$(nproc)" --target attention-server attention-loadgen \
    && scripts/bundle.sh /build /bundle

FROM nvidia/cuda:${CUDA_IMAGE_VERSION}-cudnn-runtime-ubuntu24.04
COPY --from=build /bundle/bin/ /usr/local/bin/
COPY --from=build /bundle/lib/ /usr/local/lib/attention-server/
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
