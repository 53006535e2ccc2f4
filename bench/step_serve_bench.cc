// The SequenceService over a paged backend that computes nothing, for measuring the server's
// host work per sequence step from the frontend's seat without a GPU (issue 18 item 4): the
// real service, step batcher, metrics and gRPC transport, as server/main.cc builds them
// (batching policy 64 steps / 16384 tokens / no delay, --threads batch threads, decode-sized
// work inline, 4096 queued), and a "paged-null" backend whose launches return at once (or the
// cpu one: --backend cpu). Drive it with the loadgen's session workload (no AttentionService:
// leave out --check-kv-released); its `server time/step` is then host work only. SIGINT or
// SIGTERM stops it; the step batcher's summary (prepare / launch call / commit / responses per
// batch) is logged at info on stderr.
//
//   build-cpu/bench/attn_step_serve_bench --listen unix:/tmp/s.sock &
//   build-cpu/client/attention-loadgen --target unix:/tmp/s.sock --workload session \
//     --decode-api packed --batch-sessions 64 --requests 64 --concurrency 1 --max-gen 64 \
//     --layers 1 --heads 32 --kv-heads 8 --head-dim 128 --dtype bf16 --fixed-tokens 16 \
//     --verify-fraction 0 --quiet
// Not a GPU measurement: the GPU backend's staging, lanes, copies and kernels are not in it.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "backends/paged/cpu_paged_attention.h"
#include "common/worker_pool.h"
#include "kv_cache/host_pool.h"
#include "kv_cache/page_pool.h"
#include "kv_cache/sequence_store.h"
#include "metrics/metrics.h"
#include "service/sequence_service.h"

namespace attn {
namespace {

/// A paged backend that computes nothing: every call succeeds at once (outputs keep whatever
/// bytes their buffers held).
class NullPaged final : public PagedAttentionBackend {
 public:
  const std::string &name() const override { return name_; }
  const std::string &device() const override { return device_; }
  Status Append(const PagedLayerView &, int64_t, int64_t, const void *, const void *,
                kernels::DType, int64_t *) override {
    return Status::Ok();
  }
  Status CopyPage(const kernels::PagedKvPool &, int32_t, int32_t, int64_t) override {
    return Status::Ok();
  }
  Status Attend(const PagedLayerView &, const PagedQuery &, void *) override {
    return Status::Ok();
  }
  Status AppendAttendBatch(PagedAppendItem *, const PagedAttendItem *, size_t,
                           LaunchTimes *) override {
    return Status::Ok();
  }

 private:
  std::string name_ = "paged-null", device_ = "cpu";
};

int Serve(const std::string &listen, const std::string &backend_name, int threads) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);  // before any thread starts
  spdlog::set_level(spdlog::level::info);
  auto memory = HostPool::Create(int64_t{1} << 30);
  if (!memory.ok()) return 1;
  PagePool pool(memory->get(), PagePoolOptions{16, 64, false});
  SequenceStore store(&pool, SequenceStoreOptions{});
  std::unique_ptr<PagedAttentionBackend> backend;
  if (backend_name == "cpu") {
    backend = std::make_unique<CpuPagedAttention>(1);
  } else {
    backend = std::make_unique<NullPaged>();
  }
  metrics::Metrics metrics({backend->name()}, {});
  WorkerPool workers(threads, 4096);
  BatchSchedulerOptions batching;
  batching.policy = {16384, 64, 0};
  batching.threads = threads;
  batching.max_queued = 4096;
  batching.name = "sequence step";
  batching.inline_max_tokens = 16;
  SequenceServiceImpl service(&store, backend.get(), &workers, batching);
  service.SetMetrics(&metrics);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials());
  builder.RegisterService(&service);
  builder.SetMaxReceiveMessageSize(256 << 20);
  builder.SetMaxSendMessageSize(256 << 20);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server) {
    std::fprintf(stderr, "cannot listen on %s\n", listen.c_str());
    return 1;
  }
  spdlog::info("step serve bench: {} backend, {} threads, on {}", backend->name(), threads,
               listen);
  int sig = 0;
  sigwait(&signals, &sig);
  service.EndStreams();
  server->Shutdown();
  service.step_batcher()->Stop();  // logs where the batches' host time went
  workers.Stop();
  return 0;
}

}  // namespace
}  // namespace attn

int main(int argc, char **argv) {
  std::string listen, backend = "null";
  int threads = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--listen") listen = argv[i + 1];
    else if (k == "--backend") backend = argv[i + 1];
    else if (k == "--threads") threads = std::atoi(argv[i + 1]);
  }
  if (listen.empty() || argc % 2 == 0 || threads < 1 || (backend != "null" && backend != "cpu")) {
    std::fprintf(stderr, "usage: %s --listen ADDRESS [--backend null|cpu] [--threads T]\n",
                 argv[0]);
    return 2;
  }
  return attn::Serve(listen, backend, threads);
}
