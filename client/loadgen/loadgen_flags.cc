#include "loadgen/loadgen_flags.h"

#include <algorithm>
#include <iostream>

#include "attn/common/cli_finite.h"
#include "attn/common/cli_range.h"
#include "loadgen/cli_common.h"
#include "loadgen/dtype_codec.h"

namespace attn::loadgen {

const char kLoadgenDescription[] =
    "attention-loadgen: closed- and open-loop load generator for "
    "attention.v1.AttentionService.\n"
    "Each request is one causal self-attention problem (T = S = its tokens) with random normal\n"
    "inputs; the trace workload takes the tokens (and optionally the arrival times) from a\n"
    "real request trace. Prints a report (requests, errors by status code, throughput,\n"
    "latency percentiles, server phase times, backends, verification).";

namespace {

// --target, the security flags and --workload.
void AddTargetFlags(CLI::App& app, LoadgenFlags* f) {
  app.add_option("--target", f->run.target,
                 "Server address host:port or unix:PATH (Unix-domain socket)")
      ->capture_default_str();
  AddSecurityFlags(&app, &f->run.security);
  app.add_option("--workload", f->workload,
                 "trace: replay --trace; fixed: --fixed-tokens each; session: generation "
                 "sessions on SequenceService (create, prefill, decode, release); mooncake: "
                 "Mooncake trace replay with shared prefixes forked (ForkSequence)")
      ->check(CLI::IsMember({"trace", "fixed", "session", "mooncake"}))
      ->capture_default_str();
}

// The session and mooncake workloads' flags.
void AddSessionFlags(CLI::App& app, SessionOptions* session) {
  app.add_option("--layers", session->layers, "session/mooncake: layers per sequence")
      ->check(InRange(1, 1024))
      ->capture_default_str();
  app.add_option("--decode-api", session->decode_api,
                 "session/mooncake: decode steps through extend (unary Extend), batch "
                 "(ExtendBatch over up to --batch-sessions sessions of a worker, one sub-message "
                 "per step; session only), packed (the same as one packed ExtendBatch: one q, k, "
                 "v tensor, one o; session only), packed-stream (packed batches on one "
                 "ExtendBatchStream, --batches-in-flight micro-batches in flight; session only) "
                 "or stream (one ExtendStream per session, per-message latency)")
      ->check(CLI::IsMember({"extend", "batch", "stream", "packed", "packed-stream"}))
      ->capture_default_str();
  app.add_option("--batch-sessions", session->batch_sessions,
                 "session, --decode-api batch/packed/packed-stream: concurrent sessions per "
                 "worker decoded together")
      ->check(InRange(1, 4096))
      ->capture_default_str();
  app.add_option("--batches-in-flight", session->batches_in_flight,
                 "session, --decode-api packed-stream: the group is split into this many "
                 "micro-batches, all in flight on its stream (each one's next layer is sent as "
                 "soon as its previous layer's reply arrives); keep it <= the server's "
                 "--max-batches-in-flight")
      ->check(InRange(1, 64))
      ->capture_default_str();
  app.add_option("--region", session->region,
                 "session, --decode-api packed/packed-stream: where q, k, v and o travel: none "
                 "(their bytes in the messages) or host (a POSIX shared-memory region per group, "
                 "leased with SharedMemoryLease; same machine as the server; the message "
                 "latency includes the copies into and out of the region)")
      ->check(CLI::IsMember({"none", "host"}))
      ->capture_default_str();
  app.add_option("--gen-scale", session->gen_scale,
                 "session/mooncake: multiply the trace's generated tokens by this (rounded)")
      ->check(NonNegative())
      ->capture_default_str();
  app.add_option("--max-gen", session->max_gen,
                 "session/mooncake: upper clamp of decode steps per session (also the steps of "
                 "each session when --fixed-tokens is given)")
      ->check(NonNegative())
      ->capture_default_str();
  app.add_option("--prefix-cache-sequences", session->prefix_cache_sequences,
                 "mooncake: live sequences kept for prefix sharing (LRU; evicted ones released)")
      ->check(InRange(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  app.add_flag("--check-kv-released", session->check_kv_released,
               "session/mooncake: at the end, call GetServerInfo and GetLoad and exit 1 unless "
               "the KV cache has 0 pages used and 0 live sequences");
}

// Which requests, how many, how fast: trace, counts, duration, loop mode and rate, workers,
// token scaling and pacing, the fixed size.
void AddTraceFlags(CLI::App& app, LoadgenFlags* f) {
  app.add_option("--trace", f->trace_path,
                 "Trace file: Azure CSV (TIMESTAMP,ContextTokens,GeneratedTokens) or Mooncake "
                 ".jsonl [default: " +
                     DefaultTracePath() + "]");
  app.add_option("--trace-offset", f->trace_offset, "Trace rows to skip before the first request")
      ->check(NonNegative())
      ->capture_default_str();
  app.add_option("--requests", f->requests,
                 "Requests to send [default: every trace row after the offset (unlimited with "
                 "--duration); fixed: 100]. More than the trace's rows cycles through it again")
      ->check(NonNegative());
  app.add_option("--duration", f->duration_s, "Stop issuing requests after this many seconds")
      ->check(NonNegative());
  app.add_option("--mode", f->mode,
                 "closed: --concurrency workers, one call each in flight; open: Poisson "
                 "arrivals at --rate through async calls, latency from the scheduled send time")
      ->check(CLI::IsMember({"closed", "open"}))
      ->capture_default_str();
  app.add_option("--rate", f->run.rate, "Open loop: mean arrivals per second (required there)")
      ->check(Positive());
  app.add_option("--max-in-flight", f->run.max_in_flight,
                 "Open loop: cap on outstanding calls; an arrival finding it full waits for a "
                 "slot (counted as client overload; latency still from its scheduled time)")
      ->check(InRange(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--concurrency", f->run.concurrency,
                 "Closed-loop workers, each with its own channel and one request in flight")
      ->check(InRange(1, 4096))
      ->capture_default_str();
  app.add_option("--token-scale", f->scaling.scale,
                 "Multiply trace context tokens by this (rounded, then clamped)")
      ->check(Positive())
      ->capture_default_str();
  app.add_option("--min-tokens", f->scaling.min_tokens, "Lower clamp for scaled tokens")
      ->check(InRange(int64_t{1}, int64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--max-tokens", f->scaling.max_tokens, "Upper clamp for scaled tokens")
      ->check(InRange(int64_t{1}, int64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--time-scale", f->time_scale,
                 "0: ignore timestamps, send as fast as the workers allow. >0: request i is sent "
                 "no earlier than (t_i - t_0) x F s after start; latency counts from then")
      ->check(NonNegative())
      ->capture_default_str();
  f->fixed_option =
      app.add_option("--fixed-tokens", f->fixed_tokens, "Tokens per request of the fixed workload")
          ->check(InRange(int64_t{1}, int64_t{1} << 40))
          ->capture_default_str();
}

// The model shape of every request and the backend.
void AddShapeFlags(CLI::App& app, LoadgenFlags* f) {
  ModelShape& shape = f->run.shape;
  app.add_option("--batch", shape.batch, "B")->check(Positive())->capture_default_str();
  app.add_option("--heads", shape.heads, "N, query heads")
      ->check(Positive())
      ->capture_default_str();
  app.add_option("--kv-heads", shape.kv_heads, "K, key/value heads (N % K == 0)")
      ->check(Positive())
      ->capture_default_str();
  app.add_option("--head-dim", shape.head_dim, "H")->check(Positive())->capture_default_str();
  app.add_option("--dtype", f->dtype_name, "Input/output dtype")
      ->check(CLI::IsMember({"bf16", "fp16", "fp32"}))
      ->capture_default_str();
  app.add_option("--causal", f->causal_name, "Causal alignment of the mask")
      ->check(CLI::IsMember({"top_left", "bottom_right", "none"}))
      ->capture_default_str();
  app.add_option("--backend", shape.backend, "Backend name; empty: the server's default");
  app.add_flag("--return-lse", shape.return_lse, "Ask for lse (and verify it when sampled)");
}

// Verification, seed, deadlines, message size, outputs and the exit policy.
void AddRunFlags(CLI::App& app, LoadgenFlags* f) {
  RunOptions& run = f->run;
  app.add_option("--verify-fraction", run.verify_fraction,
                 "Fraction of responses checked against the float64 oracle (on the worker, "
                 "after the latency is taken)")
      ->check(InRange(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--tolerance", run.tolerance,
                 "Relative L2 error (||o - ref|| / ||ref||) a verified output passes within "
                 "(each row within 5x); 0: by the dtype (fp32 1e-5, fp16 2e-3, bf16 1e-2). "
                 "E.g. 0.06 for a backend computing in FP8 on bf16 inputs")
      ->check(InRange(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--seed", run.seed, "Seed of the inputs and of the verification sample")
      ->capture_default_str();
  app.add_option("--deadline-ms", run.deadline_ms, "Per-call deadline")
      ->check(Positive())
      ->capture_default_str();
  app.add_option("--connect-timeout-ms", run.connect_timeout_ms,
                 "How long a worker waits for its connection; on failure the run stops")
      ->check(Positive())
      ->capture_default_str();
  app.add_option("--max-message-mb", run.max_message_mb, "Client max send/receive message size")
      ->check(InRange(1, 2047))
      ->capture_default_str();
  app.add_option("--json", f->json_path, "Also write the report as JSON to this path");
  app.add_option("--csv", f->csv_path, "Also write the summary as CSV (header + one row) here");
  app.add_flag("--quiet", f->quiet, "No progress line on stderr (printed once a second otherwise)");
  app.add_flag("--fail-on-error", f->fail_on_error,
               "Exit 1 if any request failed or any verified response mismatched (without it, "
               "exit 1 only when the run stopped early or nothing succeeded)");
}

// The largest request of this run (q, k and v of its most tokens) must fit the message limit:
// refused here rather than built and aborted (2^40 tokens made std::bad_alloc).
bool LargestRequestFits(const LoadgenFlags& f) {
  const RunOptions& run = f.run;
  const bool fixed = f.workload == "fixed" || f.fixed_given();
  const int64_t most = fixed ? f.fixed_tokens : f.scaling.max_tokens;
  const double bytes = static_cast<double>(std::max<int64_t>(1, run.shape.batch)) *
                       static_cast<double>(most) *
                       static_cast<double>(run.shape.heads + 2 * run.shape.kv_heads) *
                       static_cast<double>(run.shape.head_dim) * DTypeSize(run.shape.dtype);
  const double limit = static_cast<double>(std::min(run.max_message_mb, 2047)) * (1 << 20);
  if (bytes <= limit) return true;
  std::cerr << "attention-loadgen: a request of " << most << " tokens is " << bytes / (1 << 20)
            << " MiB (batch x tokens x (heads + 2 kv-heads) x head-dim x dtype), more than "
               "--max-message-mb "
            << std::min(run.max_message_mb, 2047)
            << "; use fewer tokens (--fixed-tokens / --max-tokens) or a smaller shape\n";
  return false;
}

}  // namespace

void AddLoadgenFlags(CLI::App* app, LoadgenFlags* f) {
  // Same source as the server's version (the CMake PROJECT_VERSION).
  app->set_version_flag("--version", ATTN_LOADGEN_VERSION);
  AddSweepCommand(app, &f->sweep);
  app->require_subcommand(0, 1);
  AddTargetFlags(*app, f);
  AddSessionFlags(*app, &f->session);
  AddTraceFlags(*app, f);
  AddShapeFlags(*app, f);
  AddRunFlags(*app, f);
  attn::RejectNonFiniteNumbers(*app);
}

int ParseLoadgenFlags(CLI::App* app, int argc, char** argv) {
  try {
    app->parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 prints --help / --version on stdout (exit code 0) and an error with "Run with
    // --help for more information." on stderr; its own codes (105, 109, ...) become 2.
    return app->exit(e) == 0 ? 0 : kExitCannotStart;
  }
  return -1;
}

attention::v1::CausalAlignment ParseCausal(const std::string& name) {
  return name == "top_left"       ? attention::v1::CAUSAL_TOP_LEFT
         : name == "bottom_right" ? attention::v1::CAUSAL_BOTTOM_RIGHT
                                  : attention::v1::CAUSAL_NONE;
}

int CheckRunFlags(LoadgenFlags* f) {
  RunOptions& run = f->run;
  if (f->mode == "open" && run.rate <= 0) {
    std::cerr << "attention-loadgen: --mode open needs --rate R (requests/s)\n";
    return kExitCannotStart;
  }
  if (!ParseDType(f->dtype_name, &run.shape.dtype)) return kExitCannotStart;
  run.shape.causal = ParseCausal(f->causal_name);
  if (const std::string error = ValidateShape(run.shape); !error.empty()) {
    std::cerr << "attention-loadgen: " << error << "\n";
    return kExitCannotStart;
  }
  if (f->scaling.min_tokens > f->scaling.max_tokens) {
    std::cerr << "attention-loadgen: --min-tokens exceeds --max-tokens\n";
    return kExitCannotStart;
  }
  if (!LargestRequestFits(*f)) return kExitCannotStart;
  run.duration_s = f->duration_s;
  return -1;
}

}  // namespace attn::loadgen
