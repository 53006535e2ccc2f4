#include "loadgen/sweep_command.h"

#include <grpcpp/grpcpp.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <ctime>
#include <fstream>
#include <iostream>
#include <sstream>

#include "attention/v1/attention.grpc.pb.h"
#include "attn/common/cli_range.h"
#include "loadgen/interrupt.h"
#include "loadgen/progress.h"
#include "loadgen/report.h"
#include "loadgen/sweep.h"
#include "loadgen/workload.h"

#ifndef ATTN_LOADGEN_PLOT_SCRIPT
#define ATTN_LOADGEN_PLOT_SCRIPT ""
#endif

extern char** environ;

namespace attn::loadgen {

namespace {

// plot_sweep.py: the source tree's (compile definition), else next to the binary, else an
// installed tree's share/attention-server.
std::string DefaultPlotScript() {
  const std::string exe_dir = ExecutableDir();
  const std::vector<std::string> candidates = {
      ATTN_LOADGEN_PLOT_SCRIPT, exe_dir + "/plot_sweep.py",
      exe_dir + "/../share/attention-server/plot_sweep.py"};
  for (const auto& c : candidates) {
    if (!c.empty() && FileExists(c)) return c;
  }
  return candidates.front();
}

}  // namespace

namespace {

// GetServerInfo from `run.target` (same security as the sweep's calls). False and `error` set
// when the call fails.
bool FetchServerInfo(const RunOptions& run, attention::v1::GetServerInfoResponse* info,
                     std::string* error) {
  grpc::ChannelArguments args;
  auto stub =
      attention::v1::AttentionService::NewStub(MakeSecureChannel(run.target, run.security, args));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(run.connect_timeout_ms));
  const grpc::Status status =
      stub->GetServerInfo(&context, attention::v1::GetServerInfoRequest(), info);
  if (status.ok()) return true;
  *error = "GetServerInfo on " + run.target + " failed: " + StatusCodeName(status.error_code()) +
           ": " + status.error_message();
  return false;
}

// Spawned children start with SIGINT/SIGTERM unblocked (Interrupt blocks them in this process).
int RunProcess(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, argv[0], nullptr, &attr, argv.data(), environ);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) return -1;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  if (!WIFEXITED(status)) return -1;
  return WEXITSTATUS(status) == 127 ? -1 : WEXITSTATUS(status);
}

// "2026-12-02 00:41 UTC"
std::string UtcNow() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M UTC", &tm);
  return buf;
}

std::vector<std::string> SplitBackends(const std::string& list) {
  std::vector<std::string> backends;
  std::stringstream ss(list);
  std::string b;
  while (std::getline(ss, b, ',')) {
    if (!b.empty()) backends.push_back(b);
  }
  if (backends.empty()) backends.push_back("");
  return backends;
}

}  // namespace

int RunSweep(const SweepArgs& a) {
  const std::vector<std::string> backends = SplitBackends(a.backends);
  std::string error;
  const std::vector<SweepPoint> points =
      SweepPoints(a.kind, a.run.shape, a.tokens, a.seqs, a.batches, &error);
  if (points.empty()) {
    std::cerr << "attention-loadgen sweep: " << error << "\n";
    return kExitCannotStart;
  }
  for (const SweepPoint& p : points) {
    if (const std::string e = ValidateShape(p.shape); !e.empty()) {
      std::cerr << "attention-loadgen sweep: " << p.label << ": " << e << "\n";
      return kExitCannotStart;
    }
  }
  // Every backend must exist (and be usable) on the server before anything is measured: a
  // missing one would only give failed points.
  attention::v1::GetServerInfoResponse server;
  if (!FetchServerInfo(a.run, &server, &error)) {
    std::cerr << "attention-loadgen sweep: " << error << "\n";
    return kExitCannotStart;
  }
  if (const std::string e = CheckSweepBackends(server, backends); !e.empty()) {
    std::cerr << "attention-loadgen sweep: " << e << "\n";
    return kExitCannotStart;
  }
  mkdir(a.out_dir.c_str(), 0755);
  const std::string csv_path = a.out_dir + "/sweep-" + a.kind + ".csv";
  const std::string png_path = a.out_dir + "/sweep-" + a.kind + ".png";
  std::vector<SweepRow> rows;
  bool any_error = false;
  for (const SweepPoint& point : points) {
    for (const std::string& backend : backends) {
      if (Interrupt::Requested()) break;
      RunOptions run = a.run;
      run.shape = point.shape;
      run.shape.backend = backend;
      run.duration_s = 0;
      const RequestPlan plan = RequestPlan::Fixed(point.tokens);
      if (a.warmup > 0) {
        run.max_requests = a.warmup;
        const RunResult warm = RunClosedLoop(run, plan);
        if (!warm.stop_reason.empty()) {
          std::cerr << "attention-loadgen sweep: " << warm.stop_reason << "\n";
          return kExitCannotStart;
        }
        if (Interrupt::Requested()) break;
      }
      run.max_requests = a.requests;
      Progress progress(!a.quiet);
      run.progress = &progress;
      if (!a.quiet) std::cerr << "sweep " << a.kind << " " << point.label << " " << backend << "\n";
      progress.Start();
      RunResult result = RunClosedLoop(run, plan);
      progress.Stop();
      if (Interrupt::Requested()) break;  // a partial point is not written
      RunInfo info;
      info.target = run.target;
      info.backend = backend;
      info.concurrency = run.concurrency;
      info.stop_reason = result.stop_reason;
      SweepRow row{point, backend.empty() ? "(default)" : backend,
                   BuildReport(info, result.samples, result.wall_s)};
      if (row.report.ok != row.report.sent) {
        any_error = true;
        for (const auto& [code, count] : row.report.errors) {
          std::cerr << "attention-loadgen sweep: " << point.label << " " << backend << ": " << count
                    << " x " << code << " (" << row.report.first_messages.at(code) << ")\n";
        }
      }
      rows.push_back(std::move(row));
      if (!result.stop_reason.empty()) {
        std::cerr << "attention-loadgen sweep: " << result.stop_reason << "\n";
        return kExitCannotStart;
      }
    }
    if (Interrupt::Requested()) break;
  }
  const size_t planned = points.size() * backends.size();
  if (Interrupt::Requested()) {
    std::cout << "INTERRUPTED by " << Interrupt::SignalName() << ": " << rows.size() << " of "
              << planned << " (point, backend) runs done; writing those\n";
  }
  std::cout << FormatSweepTable(a.kind, rows) << std::flush;
  if (!WriteFile(csv_path, SweepCsv(a.kind, rows))) {
    std::cerr << "attention-loadgen sweep: cannot write " << csv_path << "\n";
    return kExitCannotStart;
  }
  std::cout << "wrote " << csv_path << "\n";
  int status = 0;
  if (a.plot != "off" && !rows.empty()) {
    const std::string script = a.plot_script.empty() ? DefaultPlotScript() : a.plot_script;
    const std::string title =
        SweepTitle(a.kind, server, a.run.shape, a.tokens, a.backends, UtcNow());
    const int rc = RunProcess({a.python, script, csv_path, png_path, a.kind, title});
    if (rc == 0) {
      std::cout << "wrote " << png_path << "\n";
    } else {
      std::cerr << "attention-loadgen sweep: warning: no plot written ("
                << (rc < 0    ? "cannot run " + a.python
                    : rc == 3 ? "matplotlib is missing: python3 -m pip install matplotlib"
                              : a.python + " " + script + " exited " + std::to_string(rc))
                << "); the CSV is at " << csv_path << "\n";
      if (a.plot == "required") status = 3;
    }
  }
  std::cout << std::flush;
  if (Interrupt::Requested()) return Interrupt::ExitCode();
  if (status == 0 && any_error) status = 1;
  return status;
}

void AddSweepCommand(CLI::App* app, SweepArgs* a) {
  CLI::App* sweep = app->add_subcommand(
      "sweep",
      "Reproduce the codelab's tables: a sequence-length, batch or MHA/GQA/MQA sweep across "
      "backends. Each (point, backend) runs --warmup then --requests closed-loop fixed requests; "
      "prints a table (p50/p99 ms, req/s, achieved TFLOP/s = server flops / kernel time, each "
      "launch counted once) and "
      "writes OUT/sweep-<kind>.csv and OUT/sweep-<kind>.png (via plot_sweep.py and matplotlib)");
  sweep
      ->add_option("--target", a->run.target,
                   "Server address host:port or unix:PATH (Unix-domain socket)")
      ->capture_default_str();
  AddSecurityFlags(sweep, &a->run.security);
  sweep->add_option("--backends", a->backends, "Comma-separated backends to compare")
      ->capture_default_str();
  sweep
      ->add_option("--sweep", a->kind,
                   "seq: sequence lengths; batch: batch sizes; heads: MHA "
                   "(K=N), GQA (K=N/4), MQA (K=1)")
      ->check(CLI::IsMember({"seq", "batch", "heads"}))
      ->required();
  sweep->add_option("--seq", a->seqs, "Tokens (T = S) of the seq sweep")
      ->delimiter(',')
      ->capture_default_str();
  sweep->add_option("--batches", a->batches, "Batch sizes of the batch sweep")
      ->delimiter(',')
      ->capture_default_str();
  sweep->add_option("--tokens", a->tokens, "Tokens per request of the batch and heads sweeps")
      ->check(Positive())
      ->capture_default_str();
  sweep->add_option("--batch", a->run.shape.batch, "B (seq and heads sweeps)")
      ->check(Positive())
      ->capture_default_str();
  sweep->add_option("--heads", a->run.shape.heads, "N, query heads")
      ->check(Positive())
      ->capture_default_str();
  sweep->add_option("--kv-heads", a->run.shape.kv_heads, "K (seq and batch sweeps)")
      ->check(Positive())
      ->capture_default_str();
  sweep->add_option("--head-dim", a->run.shape.head_dim, "H")
      ->check(Positive())
      ->capture_default_str();
  sweep->add_option("--dtype", a->dtype_name, "Input/output dtype")
      ->check(CLI::IsMember({"bf16", "fp16", "fp32"}))
      ->capture_default_str();
  sweep->add_option("--causal", a->causal_name, "Causal alignment of the mask")
      ->check(CLI::IsMember({"top_left", "bottom_right", "none"}))
      ->capture_default_str();
  sweep->add_option("--requests", a->requests, "Measured requests per point and backend")
      ->check(Positive())
      ->capture_default_str();
  sweep->add_option("--warmup", a->warmup, "Unmeasured requests first (per point and backend)")
      ->check(NonNegative())
      ->capture_default_str();
  sweep->add_option("--concurrency", a->run.concurrency, "Closed-loop workers")
      ->check(InRange(1, 4096))
      ->capture_default_str();
  sweep->add_option("--deadline-ms", a->run.deadline_ms, "Per-call deadline")
      ->check(Positive())
      ->capture_default_str();
  sweep->add_option("--seed", a->run.seed, "Seed of the inputs")->capture_default_str();
  sweep->add_option("--out", a->out_dir, "Directory for sweep-<kind>.csv and .png")
      ->capture_default_str();
  sweep
      ->add_option("--plot", a->plot,
                   "required: exit 3 when the PNG cannot be made (CSV still written); "
                   "optional: warn only; off: no PNG")
      ->check(CLI::IsMember({"required", "optional", "off"}))
      ->capture_default_str();
  sweep->add_option("--python", a->python, "Python interpreter for the plot")
      ->capture_default_str();
  sweep->add_option("--plot-script", a->plot_script,
                    "plot_sweep.py to use [default: " + DefaultPlotScript() + "]");
  sweep->add_flag("--quiet", a->quiet, "No progress lines on stderr");
}

}  // namespace attn::loadgen
