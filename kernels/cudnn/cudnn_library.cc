// libcudnn.so.9 search and choice (cudnn_library.h). Pure host code: dlopen/glob only.
#include "attn/kernels/cudnn_library.h"

#include <dlfcn.h>  // dlmopen, LM_ID_NEWLM: _GNU_SOURCE (g++ defines it)
#include <glob.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <set>
#include <sstream>

#include "attn/kernels/cudnn_version.h"

namespace attn::kernels {
namespace {

constexpr char kLibName[] = "libcudnn.so.9";

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::string(v) : std::string();
}

bool IsFile(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool IsExecutable(const std::string& path) { return ::access(path.c_str(), X_OK) == 0; }

std::string Parent(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::vector<std::string> Glob(const std::string& pattern) {
  std::vector<std::string> out;
  glob_t g{};
  if (::glob(pattern.c_str(), 0, nullptr, &g) == 0) {
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  }
  ::globfree(&g);
  return out;
}

// site-packages / dist-packages directories of one environment prefix, sorted (glob order).
std::vector<std::string> SiteDirs(const std::string& prefix) {
  std::vector<std::string> out;
  for (const char* pat : {"/lib/python3*/site-packages", "/lib/python3*/dist-packages",
                          "/lib/python3/dist-packages", "/lib64/python3*/site-packages"}) {
    for (std::string& d : Glob(prefix + pat)) out.push_back(std::move(d));
  }
  return out;
}

}  // namespace

CudnnSearchInputs DefaultCudnnSearchInputs(const std::string& explicit_library,
                                           const std::string& build_library) {
  CudnnSearchInputs in;
  in.explicit_library = explicit_library;
  in.env_library = Env("ATTN_CUDNN_LIBRARY");
  in.build_library = build_library;
  std::stringstream path(Env("PATH"));
  for (std::string dir; std::getline(path, dir, ':');) {
    if (dir.empty()) continue;
    const std::string py = dir + "/python3";
    if (!IsExecutable(py)) continue;
    in.python_prefixes.push_back(Parent(dir));
    char real[PATH_MAX];
    if (::realpath(py.c_str(), real) != nullptr) {
      in.python_prefixes.push_back(Parent(Parent(real)));
    }
  }
  for (const char* var : {"VIRTUAL_ENV", "CONDA_PREFIX"}) {
    if (std::string v = Env(var); !v.empty()) in.python_prefixes.push_back(v);
  }
  in.python_prefixes.push_back("/opt/torch/.venv");
  in.python_prefixes.push_back("/usr");
  in.python_prefixes.push_back("/usr/local");
  if (const std::string home = Env("HOME"); !home.empty()) {
    in.python_prefixes.push_back(home + "/.local");
    for (std::string& v : Glob(home + "/.pyenv/versions/*")) in.python_prefixes.push_back(v);
  }
  in.system_dirs = {"/usr/lib/x86_64-linux-gnu", "/usr/local/cuda/lib64", "/usr/lib64",
                    "/usr/local/lib"};
  return in;
}

std::vector<CudnnCandidate> CudnnLibraryCandidates(const CudnnSearchInputs& in) {
  if (!in.explicit_library.empty()) return {{in.explicit_library, "--cudnn-library"}};
  if (!in.env_library.empty()) return {{in.env_library, "$ATTN_CUDNN_LIBRARY"}};
  std::vector<CudnnCandidate> out;
  std::set<std::string> seen;  // resolved paths already listed
  auto add = [&](const std::string& path, const std::string& step) {
    char real[PATH_MAX];
    const std::string key = ::realpath(path.c_str(), real) != nullptr ? real : path;
    if (seen.insert(key).second) out.push_back({path, step});
  };
  if (!in.loader_name.empty()) {
    out.push_back({in.loader_name, "dynamic loader (LD_LIBRARY_PATH, RUNPATH, ld.so.cache)"});
  }
  if (!in.build_library.empty() && IsFile(in.build_library)) {
    add(in.build_library, "library found at build time");
  }
  for (const std::string& prefix : in.python_prefixes) {
    for (const std::string& site : SiteDirs(prefix)) {
      const std::string lib = site + "/nvidia/cudnn/lib/" + kLibName;
      if (IsFile(lib)) add(lib, "python package nvidia-cudnn-cu13 (" + prefix + ")");
    }
  }
  for (const std::string& dir : in.system_dirs) {
    const std::string lib = dir + "/" + kLibName;
    if (IsFile(lib)) add(lib, "system directory " + dir);
  }
  return out;
}

namespace {

// dlopen (base namespace) or dlmopen (a fresh namespace) `path` and read cudnnGetVersion().
StatusOr<CudnnOpened> OpenIn(const std::string& path, bool fresh_namespace) {
  dlerror();
  void* h = fresh_namespace ? ::dlmopen(LM_ID_NEWLM, path.c_str(), RTLD_NOW | RTLD_LOCAL)
                            : ::dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (h == nullptr) {
    const char* err = dlerror();
    return FailedPrecondition(err != nullptr ? std::string(err) : path + ": dlopen failed");
  }
  using GetVersion = size_t (*)();
  auto fn = reinterpret_cast<GetVersion>(::dlsym(h, "cudnnGetVersion"));
  if (fn == nullptr) {
    ::dlclose(h);
    return FailedPrecondition(path + ": no cudnnGetVersion symbol (not a cuDNN library)");
  }
  CudnnOpened o;
  o.handle = h;
  o.version = static_cast<int64_t>(fn());
  o.path = path;
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(fn), &info) != 0 && info.dli_fname != nullptr) {
    o.path = info.dli_fname;  // the file the loader picked for a bare name
  }
  return o;
}

}  // namespace

StatusOr<CudnnOpened> ProbeCudnn(const std::string& path) {
  auto o = OpenIn(path, /*fresh_namespace=*/true);
  if (o.ok()) {
    ::dlclose(o->handle);
    o->handle = nullptr;
  }
  return o;
}

StatusOr<CudnnOpened> DlopenCudnn(const std::string& path) {
  return OpenIn(path, /*fresh_namespace=*/false);
}

void DlcloseCudnn(void* handle) {
  if (handle != nullptr) ::dlclose(handle);
}

StatusOr<CudnnOpened> OpenCudnnLibrary(const std::vector<CudnnCandidate>& candidates,
                                       int64_t build_version, const CudnnOpenFn& probe,
                                       const CudnnOpenFn& open, const CudnnCloseFn& close) {
  std::string tried;
  // At most kMaxProbes candidates: each probe may keep a link-map namespace (glibc has 16).
  constexpr size_t kMaxProbes = 12;
  size_t probes = 0;
  for (const CudnnCandidate& c : candidates) {
    std::string why;
    if (++probes > kMaxProbes) {
      why = "not tried (more than " + std::to_string(kMaxProbes) + " candidates)";
    } else if (auto p = probe(c.path); !p.ok()) {
      why = p.status().message();
    } else if (Status v = CheckCudnnVersion(build_version, p->version); !v.ok()) {
      why = p->path + " is cuDNN " + CudnnVersionString(p->version) + ": " + v.message();
    } else {
      auto o = open(c.path);
      if (!o.ok()) {
        why = o.status().message();
      } else if (o->version != p->version) {
        // Another cuDNN of the same soname was already in the process: refuse the mix.
        close(o->handle);
        return FailedPrecondition("loading " + c.path + " gave cuDNN " +
                                  CudnnVersionString(o->version) + " where it is " +
                                  CudnnVersionString(p->version) +
                                  " (another libcudnn is already loaded in this process)");
      } else {
        o->step = c.step;
        return o;
      }
    }
    tried += (tried.empty() ? "" : "; ") + std::string("[") + c.step + "] " + c.path + ": " + why;
  }
  if (candidates.empty()) tried = "no libcudnn.so.9 found in any search step";
  return FailedPrecondition("no usable cuDNN for this build (headers " +
                            CudnnVersionString(build_version) + "): " + tried +
                            ". Install the pinned nvidia-cudnn-cu13 wheel "
                            "(scripts/cudnn_pins.txt) or name a library with --cudnn-library");
}

}  // namespace attn::kernels
