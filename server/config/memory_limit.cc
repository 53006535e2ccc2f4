#include "config/memory_limit.h"

#include <algorithm>
#include <charconv>
#include <fstream>
#include <sstream>
#include <string>

namespace attn {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\n' || s.back() == '\t' ||
                        s.back() == '\r')) {
    s.remove_suffix(1);
  }
  return s;
}

int64_t ParseCount(std::string_view s) {
  int64_t v = -1;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || v <= 0) return -1;
  return v;
}

std::string ReadFile(const char* path) {
  std::ifstream f(path);
  if (!f) return "";
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

int64_t ParseCgroupMemoryLimit(std::string_view text) {
  text = Trim(text);
  if (text == "max") return -1;
  const int64_t v = ParseCount(text);
  if (v >= (int64_t{1} << 62)) return -1;  // cgroup v1's "no limit" (page-rounded LONG_MAX)
  return v;
}

int64_t ParseMemTotal(std::string_view meminfo) {
  const size_t at = meminfo.find("MemTotal:");
  if (at == std::string_view::npos) return -1;
  std::string_view rest = meminfo.substr(at + 9);
  rest = rest.substr(0, rest.find('\n'));
  rest = Trim(rest);
  if (rest.size() < 3 || rest.substr(rest.size() - 2) != "kB") return -1;
  const int64_t kib = ParseCount(Trim(rest.substr(0, rest.size() - 2)));
  return kib > 0 ? kib * 1024 : -1;
}

int64_t ProcessMemoryLimit() {
  int64_t limit = ParseMemTotal(ReadFile("/proc/meminfo"));
  int64_t cgroup = ParseCgroupMemoryLimit(ReadFile("/sys/fs/cgroup/memory.max"));
  if (cgroup < 0) cgroup = ParseCgroupMemoryLimit(ReadFile("/sys/fs/cgroup/memory/memory.limit_in_bytes"));
  if (cgroup > 0) limit = limit > 0 ? std::min(limit, cgroup) : cgroup;
  return limit;
}

int64_t DefaultGrpcMemoryBytes(int64_t memory_limit, int64_t max_message_bytes) {
  const int64_t floor = std::max(int64_t{1} << 30, 2 * max_message_bytes);
  if (memory_limit <= 0) return floor;
  // Whole MiB (whole GiB from 4 GiB on): --help shows the default as "5GiB", not "6170916KiB".
  const int64_t quarter = memory_limit / 4;
  const int64_t unit = quarter >= (int64_t{4} << 30) ? int64_t{1} << 30 : int64_t{1} << 20;
  return std::max(floor, quarter / unit * unit);
}

}  // namespace attn
