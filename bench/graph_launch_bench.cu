// Host cost of one small round trip on a GPU lane (issue 18 item 4): device call G1 measured a
// B=1 decode step's lane at enqueue 30 us (the CUDA graph launch) + wait 27 us for 37 us of
// device work. This bench times, for trips shaped like the lane's (H2D of the packed inputs, two
// small kernels, D2H of the outputs, four timing events), what the host spends enqueuing
// (cudaGraphLaunch, or the stream calls one by one) and the whole trip to the end of
// cudaStreamSynchronize, with and without the event nodes and the copies, and with the copies
// replaced by kernels reading and writing mapped pinned memory (zero-copy).
// Each variant runs hot (trips back to back, as a microbenchmark does) and, to see what the
// server's batch thread sees (it sleeps between steps while gRPC works on other cores), with
// the thread asleep 150 us before each trip ("sleep") and with 8 MiB of other memory written
// before each trip ("trash": the driver's code and data leave the CPU caches). Device call H1
// measured cudaGraphLaunch at ~31-35 us inside the server against 12 us here, hot.
// Build: part of bench/ when ATTN_CUDA is on (target attn_graph_launch_bench). Run:
//   attn_graph_launch_bench [iterations=3000]   -> one line per variant and mode, medians in us.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

#define CK(x)                                                                       \
  do {                                                                              \
    cudaError_t e_ = (x);                                                           \
    if (e_ != cudaSuccess) {                                                        \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x,                \
                   cudaGetErrorString(e_));                                         \
      std::exit(1);                                                                 \
    }                                                                               \
  } while (0)

// Stand-ins for the append and decode launches: read `n` words of `in`, write `n` of `out`
// (one block of 256 threads, ~2 us of device time; the real kernels' time is not the point).
__global__ void Touch(const unsigned* in, unsigned* out, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = in[i] * 2654435761u + 1u;
}

using Clock = std::chrono::steady_clock;
double Us(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }
double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Trip {
  bool copies = true;     // H2D of the inputs, D2H of the outputs (else zero-copy kernels)
  bool events = true;     // four event records around the phases
  const char* name = "";
};

struct Buffers {
  static constexpr int kInWords = 4096;   // 16 KiB in: q, k, v and the step's tables
  static constexpr int kOutWords = 2048;  // 8 KiB out: o
  unsigned *host_in = nullptr, *host_out = nullptr;  // pinned (mapped under UVA)
  unsigned *dev_in = nullptr, *dev_mid = nullptr, *dev_out = nullptr;
  cudaEvent_t ev[4];
};

void Enqueue(const Trip& t, Buffers& b, cudaStream_t s, unsigned ev_flags) {
  auto rec = [&](int i) {
    if (!t.events) return;
    if (ev_flags != 0) {
      CK(cudaEventRecordWithFlags(b.ev[i], s, ev_flags));
    } else {
      CK(cudaEventRecord(b.ev[i], s));
    }
  };
  rec(0);
  const unsigned* in = b.host_in;
  unsigned* out = b.host_out;
  if (t.copies) {
    CK(cudaMemcpyAsync(b.dev_in, b.host_in, Buffers::kInWords * 4, cudaMemcpyHostToDevice, s));
    in = b.dev_in;
    out = b.dev_out;
  }
  rec(1);
  Touch<<<1, 256, 0, s>>>(in, b.dev_mid, Buffers::kInWords);
  Touch<<<1, 256, 0, s>>>(b.dev_mid, out, Buffers::kOutWords);
  rec(2);
  if (t.copies) {
    CK(cudaMemcpyAsync(b.host_out, b.dev_out, 64, cudaMemcpyDeviceToHost, s));  // counters
    CK(cudaMemcpyAsync(b.host_out, b.dev_out, Buffers::kOutWords * 4, cudaMemcpyDeviceToHost,
                       s));
  }
  rec(3);
}

enum class Mode { kHot, kSleep, kTrash };
const char* ModeName(Mode m) {
  return m == Mode::kHot ? "hot" : m == Mode::kSleep ? "sleep" : "trash";
}

void Measure(const Trip& t, Buffers& b, cudaStream_t s, int iters, bool graph, Mode mode,
             std::vector<char>& other) {
  cudaGraphExec_t exec = nullptr;
  if (graph) {
    cudaGraph_t g = nullptr;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    Enqueue(t, b, s, cudaEventRecordExternal);
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&exec, g, 0));
    CK(cudaGraphDestroy(g));
  }
  std::vector<double> enqueue, total;
  for (int i = 0; i < iters + 200; ++i) {
    if (mode == Mode::kSleep) std::this_thread::sleep_for(std::chrono::microseconds(150));
    if (mode == Mode::kTrash) std::memset(other.data(), i & 0xff, other.size());
    std::memset(b.host_in, i & 0xff, 64);  // the pack's touch of staging
    const auto t0 = Clock::now();
    if (graph) {
      CK(cudaGraphLaunch(exec, s));
    } else {
      Enqueue(t, b, s, 0);
    }
    const auto t1 = Clock::now();
    CK(cudaStreamSynchronize(s));
    const auto t2 = Clock::now();
    if (i >= 200) {  // warm-up
      enqueue.push_back(Us(t1 - t0));
      total.push_back(Us(t2 - t0));
    }
  }
  float ms = 0.f;
  if (t.events) CK(cudaEventElapsedTime(&ms, b.ev[0], b.ev[3]));
  std::printf("%-34s %-5s %-6s enqueue p50 %6.1f us  trip p50 %6.1f us  (last trip's events: "
              "%s)\n",
              t.name, ModeName(mode), graph ? "graph" : "stream", Median(enqueue), Median(total),
              t.events ? std::to_string(ms * 1e3).substr(0, 5).c_str() : "-");
  if (exec != nullptr) CK(cudaGraphExecDestroy(exec));
}

}  // namespace

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 3000;
  cudaDeviceProp p{};
  CK(cudaGetDeviceProperties(&p, 0));
  std::printf("device %s, %d iterations per variant after 200 warm-up\n", p.name, iters);
  Buffers b;
  CK(cudaHostAlloc(&b.host_in, Buffers::kInWords * 4, cudaHostAllocDefault));
  CK(cudaHostAlloc(&b.host_out, Buffers::kOutWords * 4, cudaHostAllocDefault));
  CK(cudaMalloc(&b.dev_in, Buffers::kInWords * 4));
  CK(cudaMalloc(&b.dev_mid, Buffers::kInWords * 4));
  CK(cudaMalloc(&b.dev_out, Buffers::kOutWords * 4));
  for (auto& e : b.ev) CK(cudaEventCreate(&e));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const Trip trips[] = {
      {true, true, "copies + 4 events (the lane today)"},
      {true, false, "copies, no events"},
      {false, true, "zero-copy + 4 events"},
      {false, false, "zero-copy, no events"},
  };
  std::vector<char> other(8u << 20);
  for (Mode mode : {Mode::kHot, Mode::kSleep, Mode::kTrash}) {
    for (const Trip& t : trips) {
      Measure(t, b, s, iters, /*graph=*/true, mode, other);
      Measure(t, b, s, iters, /*graph=*/false, mode, other);
    }
  }
  return 0;
}
