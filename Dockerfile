# attention-server image (first draft; DESIGN.md §12).
# Build stage: NVIDIA's CUDA 13 devel image (Ubuntu 24.04) with the same packages as
# scripts/bootstrap.sh installs on Debian; runtime stage: the CUDA runtime image with cuDNN,
# the shared libraries the server links, non-root, gRPC on 50051.
ARG CUDA_VERSION=13.0.0
FROM nvidia/cuda:${CUDA_VERSION}-cudnn-devel-ubuntu24.04 AS build
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      build-essential cmake ninja-build pkg-config git ca-certificates \
      libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler \
      libspdlog-dev libfmt-dev prometheus-cpp-dev libcivetweb-dev libcli11-dev \
      nlohmann-json3-dev libssl-dev zlib1g-dev libc-ares-dev libre2-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cmake -S . -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release -DATTN_TESTS=OFF \
      -DCMAKE_CUDA_ARCHITECTURES="89;90a" \
    && cmake --build /build -j"$(nproc)" --target attention-server attention-loadgen

FROM nvidia/cuda:${CUDA_VERSION}-cudnn-runtime-ubuntu24.04
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      libgrpc++1.51t64 libprotobuf32t64 libspdlog1.12 libprometheus-cpp-core1.0 \
      libprometheus-cpp-pull1.0 ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --no-create-home attn
COPY --from=build /build/server/attention-server /build/client/attention-loadgen /usr/local/bin/
COPY client/data /usr/local/share/attention-server/data
USER 10001
EXPOSE 50051
# Health: grpc.health.v1 on the same port (kubelet gRPC probes).
ENTRYPOINT ["/usr/local/bin/attention-server", "--listen", "0.0.0.0:50051"]
