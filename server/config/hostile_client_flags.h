// The flags that bound what one careless or hostile client can cost (issue 16): work per
// Attend call, memory and time held by responses a client never reads, HTTP/2 streams per
// connection, host shared-memory regions mapped (issue 18), keepalive, idle connections and the
// connection age that makes clients re-resolve (issue 19). Defaults admit the largest requests frontends
// send on purpose (README "attention-server flags").
#pragma once

#include <CLI/CLI.hpp>

#include "config/server_config.h"

namespace attn {

/// Adds --max-cpu-score-pairs, --max-gpu-flops, --grpc-memory-bytes,
/// --max-unsent-response-bytes, --max-inflight-bytes, --response-write-timeout-s,
/// --max-streams-per-connection, --max-shared-memory-regions, --max-shared-memory-bytes,
/// --keepalive-time-s, --keepalive-timeout-s and
/// --max-connection-idle-s, --max-connection-age-s and --max-connection-age-grace-s to `app`,
/// bound to `c`.
void AddHostileClientFlags(CLI::App& app, ServerConfig* c);

}  // namespace attn
