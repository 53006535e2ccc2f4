// Replays inputs through LLVMFuzzerTestOneInput without fuzzing: every file named on the command
// line, and every file inside each directory named (sorted, not recursive). Used by the
// `fuzz_regressions` ctest test (any compiler; under ASan/UBSan in the sanitizer build) to keep
// every crash the fuzzer found, and the seed corpus, passing.
// A single allocation over kMaxAllocationBytes aborts, as libFuzzer's -malloc_limit_mb does:
// no input (at most 1 MiB) may make the server allocate that much at once.
// Exit status: 0 when every input ran (a failing input aborts the process); 2 on usage errors.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <new>
#include <string>
#include <vector>

namespace {
constexpr size_t kMaxAllocationBytes = size_t{256} << 20;
}  // namespace

// Replaces the global allocation functions of this program (the array forms call these).
void* operator new(size_t n) {
  if (n > kMaxAllocationBytes) {
    std::fprintf(stderr, "replay: single allocation of %zu bytes (limit %zu): failing input\n", n,
                 kMaxAllocationBytes);
    std::abort();
  }
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s FILE_OR_DIR...\n", argv[0]);
    return 2;
  }
  std::vector<fs::path> files;
  for (int i = 1; i < argc; ++i) {
    const fs::path p(argv[i]);
    if (fs::is_directory(p)) {
      std::vector<fs::path> in_dir;
      for (const auto& e : fs::directory_iterator(p)) {
        if (e.is_regular_file() && e.path().filename().string()[0] != '.') {
          in_dir.push_back(e.path());
        }
      }
      std::sort(in_dir.begin(), in_dir.end());
      files.insert(files.end(), in_dir.begin(), in_dir.end());
    } else if (fs::is_regular_file(p)) {
      files.push_back(p);
    } else {
      std::fprintf(stderr, "%s: no such file or directory\n", argv[i]);
      return 2;
    }
  }
  if (files.empty()) {
    std::fprintf(stderr, "no inputs found\n");
    return 2;
  }
  for (const fs::path& f : files) {
    std::ifstream in(f, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::fprintf(stderr, "replay %s (%zu bytes)\n", f.c_str(), bytes.size());
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  }
  std::printf("replayed %zu inputs, none failed\n", files.size());
  return 0;
}
