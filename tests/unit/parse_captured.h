// Test helper shared by the server-flag tests (byte_size_test.cc, server_flags_test.cc).
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "config/server_flags.h"

namespace attn {

/// Runs ParseServerFlags on `args` (argv[0] added) with stdout and stderr captured into `*out`;
/// returns its exit code.
inline int ParseCaptured(std::vector<std::string> args, ServerConfig* c, std::string* out) {
  args.insert(args.begin(), "attention-server");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  const int code = ParseServerFlags(static_cast<int>(argv.size()), argv.data(), c);
  *out = testing::internal::GetCapturedStdout();
  *out += testing::internal::GetCapturedStderr();
  return code;
}

}  // namespace attn
