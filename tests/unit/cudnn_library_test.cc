// libcudnn search order and choice (cudnn_library.h; issue 14 item 3). Fake directory trees
// stand in for Python environments and system directories; fake libraries (fake_cudnn.cc,
// exporting only cudnnGetVersion) stand in for cuDNN releases, opened with the real dlopen.
#include "attn/kernels/cudnn_library.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "attn/kernels/cudnn_version.h"

namespace attn::kernels {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    std::string t = (fs::temp_directory_path() / "cudnn_library_test.XXXXXX").string();
    path_ = ::mkdtemp(t.data());
  }
  ~TempDir() { fs::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Creates `path` (and its parents), a copy of `from` or a small text file.
std::string Put(const std::string& path, const std::string& from = "") {
  fs::create_directories(fs::path(path).parent_path());
  if (from.empty()) {
    std::ofstream(path) << "not a shared library\n";
  } else {
    fs::copy_file(from, path, fs::copy_options::overwrite_existing);
  }
  return path;
}

std::vector<std::string> Paths(const std::vector<CudnnCandidate>& c) {
  std::vector<std::string> out;
  for (const auto& x : c) out.push_back(x.path);
  return out;
}

TEST(CudnnLibrarySearch, DefaultOrderLoaderBuildPythonSystem) {
  TempDir d;
  const std::string& r = d.path();
  const std::string venv = r + "/opt/torch/.venv";
  const std::string a = Put(venv + "/lib/python3.12/site-packages/nvidia/cudnn/lib/libcudnn.so.9");
  const std::string b = Put(r + "/usr/lib/python3/dist-packages/nvidia/cudnn/lib/libcudnn.so.9");
  const std::string sys = Put(r + "/sys/libcudnn.so.9");
  const std::string build = Put(r + "/build/libcudnn.so.9");
  fs::create_directories(r + "/empty/lib/python3.11/site-packages");  // no cudnn: skipped
  CudnnSearchInputs in;
  in.build_library = build;
  in.python_prefixes = {r + "/empty", venv, r + "/usr", venv};  // venv twice: listed once
  in.system_dirs = {r + "/nonexistent", r + "/sys"};
  const auto c = CudnnLibraryCandidates(in);
  EXPECT_EQ(Paths(c), (std::vector<std::string>{"libcudnn.so.9", build, a, b, sys}));
  ASSERT_EQ(c.size(), 5u);
  EXPECT_NE(c[0].step.find("dynamic loader"), std::string::npos) << c[0].step;
  EXPECT_EQ(c[1].step, "library found at build time");
  EXPECT_EQ(c[2].step, "python package nvidia-cudnn-cu13 (" + venv + ")");
  EXPECT_EQ(c[4].step, "system directory " + r + "/sys");
}

TEST(CudnnLibrarySearch, ExplicitThenEnvironmentWinAlone) {
  TempDir d;
  CudnnSearchInputs in;
  in.system_dirs = {d.path()};
  Put(d.path() + "/libcudnn.so.9");
  in.env_library = "/from/env/libcudnn.so.9";
  auto c = CudnnLibraryCandidates(in);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].path, "/from/env/libcudnn.so.9");
  EXPECT_EQ(c[0].step, "$ATTN_CUDNN_LIBRARY");
  in.explicit_library = "/flag/libcudnn.so.9";
  c = CudnnLibraryCandidates(in);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].path, "/flag/libcudnn.so.9");
  EXPECT_EQ(c[0].step, "--cudnn-library");
}

TEST(CudnnLibrarySearch, SymlinkedDuplicatesAreListedOnce) {
  TempDir d;
  const std::string real = Put(d.path() + "/real/libcudnn.so.9");
  fs::create_directories(d.path() + "/link");
  fs::create_symlink(real, d.path() + "/link/libcudnn.so.9");
  CudnnSearchInputs in;
  in.loader_name.clear();
  in.system_dirs = {d.path() + "/real", d.path() + "/link"};
  EXPECT_EQ(Paths(CudnnLibraryCandidates(in)), (std::vector<std::string>{real}));
}

TEST(CudnnLibrarySearch, DefaultInputsFindPythonOnPath) {
  TempDir d;
  const std::string env = d.path() + "/env";
  Put(env + "/bin/python3");
  fs::permissions(env + "/bin/python3", fs::perms::owner_all);
  const std::string lib = Put(env + "/lib/python3.13/site-packages/nvidia/cudnn/lib/libcudnn.so.9");
  const char* old = std::getenv("PATH");
  const std::string saved = old ? old : "";
  ::setenv("PATH", (env + "/bin").c_str(), 1);
  ::unsetenv("ATTN_CUDNN_LIBRARY");
  const CudnnSearchInputs in = DefaultCudnnSearchInputs("", "");
  ::setenv("PATH", saved.c_str(), 1);
  const auto c = CudnnLibraryCandidates(in);
  bool found = false;
  for (const auto& x : c) found |= x.path == lib;
  EXPECT_TRUE(found) << "python3 on PATH at " << env;
  EXPECT_EQ(in.python_prefixes.front(), env);
  bool torch = false;
  for (const auto& p : in.python_prefixes) torch |= p == "/opt/torch/.venv";
  EXPECT_TRUE(torch);
}

// The GPU host's case: the loader finds an old system cuDNN first, a compatible one is in a
// Python environment. The old one is skipped (and closed), the compatible one is kept.
TEST(CudnnLibraryOpen, SkipsIncompatibleAndKeepsTheFirstCompatible) {
  TempDir d;
  const std::string old_lib = Put(d.path() + "/sys/libcudnn.so.9", FAKE_CUDNN_91400);
  const std::string major = Put(d.path() + "/ten/libcudnn.so.9", FAKE_CUDNN_100100);
  const std::string good = Put(d.path() + "/venv/libcudnn.so.9", FAKE_CUDNN_91900);
  const std::string newer = Put(d.path() + "/new/libcudnn.so.9", FAKE_CUDNN_92600);
  const std::vector<CudnnCandidate> c = {
      {old_lib, "system directory"}, {major, "major"}, {good, "python"}, {newer, "newer"}};
  // Built against 9.19.1: 9.19.0 differs only in the patch level.
  auto o = OpenCudnnLibrary(c, 91901);
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->version, 91900);
  EXPECT_EQ(fs::canonical(o->path), fs::canonical(good));
  EXPECT_EQ(o->step, "python");
  DlcloseCudnn(o->handle);
}

TEST(CudnnLibraryOpen, NoneUsableListsEveryAttemptAndTheRule) {
  TempDir d;
  const std::string junk = Put(d.path() + "/junk/libcudnn.so.9");  // not an ELF: dlopen fails
  const std::string old_lib = Put(d.path() + "/old/libcudnn.so.9", FAKE_CUDNN_91400);
  auto o = OpenCudnnLibrary({{junk, "python package"}, {old_lib, "system directory"}}, 91901);
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.status().code(), StatusCode::kFailedPrecondition);
  const std::string& m = o.status().message();
  EXPECT_NE(m.find("[python package] " + junk), std::string::npos) << m;
  EXPECT_NE(m.find("[system directory] " + old_lib), std::string::npos) << m;
  EXPECT_NE(m.find("9.14.0"), std::string::npos) << m;
  EXPECT_NE(m.find("9.19.1"), std::string::npos) << m;
  EXPECT_NE(m.find("minor"), std::string::npos) << m;
  EXPECT_NE(m.find("--cudnn-library"), std::string::npos) << m;
  EXPECT_FALSE(OpenCudnnLibrary({}, 91901).ok());
}

// Only the chosen candidate is loaded for use; rejected ones are only probed.
TEST(CudnnLibraryOpen, LoadsOnlyTheChosenOne) {
  std::vector<std::string> probed, opened;
  auto probe = [&](const std::string& p) -> StatusOr<CudnnOpened> {
    probed.push_back(p);
    if (p == "missing") return FailedPrecondition("missing: cannot open");
    CudnnOpened o;
    o.version = p == "old" ? 91800 : 91902;
    o.path = "/resolved/" + p;
    return o;
  };
  auto open = [&](const std::string& p) -> StatusOr<CudnnOpened> {
    opened.push_back(p);
    CudnnOpened o;
    o.handle = &opened;
    o.version = 91902;
    o.path = "/resolved/" + p;
    return o;
  };
  auto close = [](void*) { ADD_FAILURE() << "nothing to close"; };
  auto o = OpenCudnnLibrary({{"missing", "1"}, {"old", "2"}, {"good", "3"}, {"later", "4"}}, 91900,
                            probe, open, close);
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->path, "/resolved/good");
  EXPECT_EQ(o->step, "3");
  EXPECT_EQ(probed, (std::vector<std::string>{"missing", "old", "good"}));
  EXPECT_EQ(opened, (std::vector<std::string>{"good"}));
}

// A load that gives another version than the probe (a libcudnn already in the process) is
// refused, not used.
TEST(CudnnLibraryOpen, RefusesALoadThatDiffersFromTheProbe) {
  int closed = 0;
  auto probe = [](const std::string&) -> StatusOr<CudnnOpened> {
    CudnnOpened o;
    o.version = 92600;
    return o;
  };
  auto open = [](const std::string& p) -> StatusOr<CudnnOpened> {
    CudnnOpened o;
    o.handle = reinterpret_cast<void*>(intptr_t{1});
    o.version = 91900;
    o.path = p;
    return o;
  };
  auto o = OpenCudnnLibrary({{"x", "1"}}, 92600, probe, open, [&](void*) { ++closed; });
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("already loaded"), std::string::npos);
  EXPECT_EQ(closed, 1);
}

// The real probe (dlmopen) of the fake releases, then a real load: the 9.14 probe does not
// leave anything that changes what the 9.19 load reports.
TEST(CudnnLibraryOpen, ProbeLeavesNothingLoaded) {
  auto p = ProbeCudnn(FAKE_CUDNN_91400);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->version, 91400);
  EXPECT_EQ(p->handle, nullptr);
  auto o = DlopenCudnn(FAKE_CUDNN_91900);
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->version, 91900);
  DlcloseCudnn(o->handle);
}

// NVIDIA's rule (cudnn_version.cc): same major; runtime minor >= build minor; patch ignored.
TEST(CudnnVersionRule, MajorMinorPatch) {
  EXPECT_TRUE(CheckCudnnVersion(91901, 91900).ok());   // the GPU host: 9.19.0 runs a 9.19.1 build
  EXPECT_TRUE(CheckCudnnVersion(91900, 91999).ok());   // newer patch
  EXPECT_TRUE(CheckCudnnVersion(91901, 92600).ok());   // newer minor
  EXPECT_FALSE(CheckCudnnVersion(91900, 91899).ok());  // 9.18.99: older minor
  const Status s = CheckCudnnVersion(91901, 91400);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("9.14.0"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("9.19.1"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("backward compatible"), std::string::npos) << s.message();
  const Status m = CheckCudnnVersion(91900, 100100);
  EXPECT_NE(m.message().find("major"), std::string::npos) << m.message();
  EXPECT_FALSE(CheckCudnnVersion(100100, 91900).ok());
  EXPECT_FALSE(CheckCudnnVersion(91900, 0).ok());
}

}  // namespace
}  // namespace attn::kernels
