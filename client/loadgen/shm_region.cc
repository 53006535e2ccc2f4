#include "loadgen/shm_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <future>
#include <random>

namespace attn::loadgen {

namespace av1 = attention::v1;

namespace {

constexpr int64_t kAlign = 64;
constexpr std::chrono::seconds kCloseWait{5};

int64_t AlignUp(int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

std::string UniqueName() {
  static std::atomic<uint64_t> counter{0};
  std::random_device rd;
  return "/attn_loadgen_" + std::to_string(getpid()) + "_" + std::to_string(counter++) + "_" +
         std::to_string(rd());
}

}  // namespace

PackedLayout PackedLayout::For(int64_t rows, int64_t heads, int64_t kv_heads, int64_t head_dim,
                               int64_t itemsize) {
  PackedLayout l;
  l.q_row = heads * head_dim * itemsize;
  l.kv_row = kv_heads * head_dim * itemsize;
  l.q = 0;
  l.k = AlignUp(l.q + rows * l.q_row);
  l.v = AlignUp(l.k + rows * l.kv_row);
  l.o = AlignUp(l.v + rows * l.kv_row);
  l.bytes = AlignUp(l.o + rows * l.q_row);
  return l;
}

std::unique_ptr<ShmRegion> ShmRegion::Create(av1::SequenceService::Stub* stub, int64_t bytes,
                                             int64_t timeout_ms, grpc::StatusCode* code,
                                             std::string* error) {
  *code = grpc::StatusCode::INTERNAL;  // the loadgen's own failures (shm_open, mmap)
  std::unique_ptr<ShmRegion> r(new ShmRegion());
  r->name_ = UniqueName();
  r->bytes_ = bytes;
  const int fd = shm_open(r->name_.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) {
    *error = "shm_open " + r->name_ + ": " + std::strerror(errno);
    r->name_.clear();
    return nullptr;
  }
  const bool sized = ftruncate(fd, static_cast<off_t>(bytes)) == 0;
  void* p = sized ? mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED,
                         fd, 0)
                  : MAP_FAILED;
  const int err = errno;
  close(fd);
  if (p == MAP_FAILED) {
    *error = std::string(sized ? "mmap " : "ftruncate ") + r->name_ + ": " + std::strerror(err);
    return nullptr;  // the destructor unlinks the name
  }
  r->base_ = static_cast<char*>(p);
  std::memset(r->base_, 0, static_cast<size_t>(bytes));  // fault the pages in before timing

  r->lease_ = stub->SharedMemoryLease(&r->ctx_);
  av1::SharedMemoryLeaseRequest req;
  req.set_name(r->name_);
  req.set_bytes(bytes);
  av1::SharedMemoryLeaseResponse resp;
  // The first Write and Read on another thread, so that a server that never answers is cut
  // after timeout_ms (the lease stream itself has no deadline: it lives as long as the region).
  auto answered = std::async(std::launch::async, [&r, &req, &resp] {
    return r->lease_->Write(req) && r->lease_->Read(&resp);
  });
  if (answered.wait_for(std::chrono::milliseconds(timeout_ms)) != std::future_status::ready) {
    r->ctx_.TryCancel();
  }
  if (!answered.get()) {
    const grpc::Status status = r->lease_->Finish();
    r->lease_.reset();
    *code = status.ok() ? grpc::StatusCode::UNAVAILABLE : status.error_code();
    *error = "region " + r->name_ + ": " +
             (status.ok() ? std::string("the stream ended before the region was leased")
                          : status.error_message());
    return nullptr;
  }
  r->region_id_ = resp.region_id();
  return r;
}

ShmRegion::~ShmRegion() {
  if (lease_) {
    // Half-close: the server ends the lease stream once it has unmapped the region. A server
    // that does not end it within kCloseWait is cut off (the region is then released when the
    // connection goes), so that the loadgen's exit never hangs on it.
    auto ended = std::async(std::launch::async, [this] {
      lease_->WritesDone();
      av1::SharedMemoryLeaseResponse more;
      while (lease_->Read(&more)) {
      }
    });
    if (ended.wait_for(kCloseWait) != std::future_status::ready) ctx_.TryCancel();
    ended.get();
    (void)lease_->Finish();
  }
  if (base_ != nullptr) munmap(base_, static_cast<size_t>(bytes_));
  if (!name_.empty()) shm_unlink(name_.c_str());
}

void ShmRegion::Slice(int64_t offset, int64_t bytes, av1::RegionSlice* slice) const {
  slice->set_region_id(region_id_);
  slice->set_offset(offset);
  slice->set_bytes(bytes);
}

}  // namespace attn::loadgen
