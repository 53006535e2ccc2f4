// Finding and opening libcudnn.so.9 at run time (the cudnn family dlopens it; DESIGN.md §11).
//
// Search order (CudnnLibraryCandidates), each step tried in turn; the first file whose
// cudnnGetVersion() (probed in a separate link-map namespace) passes CheckCudnnVersion against
// the build's headers is loaded; the others are listed in the error if none passes:
//   1. --cudnn-library (CudnnSearchInputs::explicit_library): this one only; it wins.
//   2. $ATTN_CUDNN_LIBRARY: this one only.
//   3. "libcudnn.so.9" through the dynamic loader (LD_LIBRARY_PATH, RUNPATH, ld.so.cache).
//   4. the libcudnn.so.9 CMake found at build time (the pinned wheel's, when still there).
//   5. site-packages/nvidia/cudnn/lib/libcudnn.so.9 of every Python environment found: the
//      prefixes of each python3 on PATH, $VIRTUAL_ENV, $CONDA_PREFIX, /opt/torch/.venv (the
//      GPU hosts' PyTorch), /usr, /usr/local, ~/.local, ~/.pyenv/versions/* (lib/python3*/
//      site-packages and dist-packages, and lib/python3/dist-packages).
//   6. system directories: /usr/lib/x86_64-linux-gnu, /usr/local/cuda/lib64, /usr/lib64,
//      /usr/local/lib.
// Steps 3-6 are the default search (no flag, no environment variable). A step whose file is
// absent is skipped silently (steps 4-6 list existing files only). Compiled in every build (no
// cuDNN headers needed), so the search and the choice are unit-tested on CPU.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "attn/common/status.h"

namespace attn::kernels {

/// One file to try and which search step produced it (e.g. "--cudnn-library",
/// "python package nvidia-cudnn-cu13 (/opt/torch/.venv)", "system directory").
struct CudnnCandidate {
  std::string path;  ///< dlopen name or absolute path
  std::string step;  ///< why it is tried: the search step, for the log and GetServerInfo
};

/// Where to look. DefaultCudnnSearchInputs fills it from the process environment.
struct CudnnSearchInputs {
  std::string explicit_library;               ///< --cudnn-library (empty: not given)
  std::string env_library;                    ///< $ATTN_CUDNN_LIBRARY (empty: unset)
  std::string loader_name = "libcudnn.so.9";  ///< step 3's name (empty: step skipped)
  std::string build_library;                  ///< the build's libcudnn (empty: none found)
  std::vector<std::string> python_prefixes;   ///< environment roots, e.g. "/opt/torch/.venv"
  std::vector<std::string> system_dirs;       ///< directories holding libcudnn.so.9
};

/// The inputs of this process: `explicit_library` as given, $ATTN_CUDNN_LIBRARY, the build's
/// library, Python prefixes from $PATH (each directory holding python3: its parent, and the
/// parent of python3's resolved target), $VIRTUAL_ENV, $CONDA_PREFIX, /opt/torch/.venv, /usr,
/// /usr/local, $HOME/.local and $HOME/.pyenv/versions/*, and the system directories above.
CudnnSearchInputs DefaultCudnnSearchInputs(const std::string& explicit_library,
                                           const std::string& build_library);

/// The ordered, de-duplicated candidates of `in` (see the order above). With an explicit or
/// environment library only that one. Steps 4-6 include only files that exist.
std::vector<CudnnCandidate> CudnnLibraryCandidates(const CudnnSearchInputs& in);

/// A library that opened: the dlopen handle, cudnnGetVersion(), the file (resolved through
/// dladdr when opened by name) and the step that found it.
struct CudnnOpened {
  void* handle = nullptr;
  int64_t version = 0;
  std::string path;
  std::string step;
};

/// ProbeCudnn: loads `path` into a fresh link-map namespace (dlmopen LM_ID_NEWLM), reads its
/// version and file, closes it again (handle null). Probing in the process's own namespace
/// would leave the rejected release's sub-libraries (libcudnn_graph.so.9, ...) loaded under the
/// same sonames, and a later libcudnn.so.9 would bind to them (seen: a 9.26 shim reporting
/// 9.19 after a 9.19 probe). DlopenCudnn: loads `path` for use (RTLD_NOW | RTLD_GLOBAL, the
/// process's namespace) and reads its version. Both: FAILED_PRECONDITION with dlerror() when it
/// does not load or has no cudnnGetVersion.
using CudnnOpenFn = std::function<StatusOr<CudnnOpened>(const std::string& path)>;
using CudnnCloseFn = std::function<void(void* handle)>;
StatusOr<CudnnOpened> ProbeCudnn(const std::string& path);
StatusOr<CudnnOpened> DlopenCudnn(const std::string& path);
void DlcloseCudnn(void* handle);

/// Probes `candidates` in order (at most 12; the rest are listed as not tried) and loads with
/// `open` the first whose version passes CheckCudnnVersion(build_version, version); nothing
/// else is ever loaded into the process's namespace. None usable: FAILED_PRECONDITION listing
/// every attempt (step, path, dlerror or the version rule it broke) and how to name a library
/// (--cudnn-library). FAILED_PRECONDITION too when the loaded version differs from the probed
/// one (another libcudnn already in the process).
StatusOr<CudnnOpened> OpenCudnnLibrary(const std::vector<CudnnCandidate>& candidates,
                                       int64_t build_version, const CudnnOpenFn& probe = ProbeCudnn,
                                       const CudnnOpenFn& open = DlopenCudnn,
                                       const CudnnCloseFn& close = DlcloseCudnn);

}  // namespace attn::kernels
