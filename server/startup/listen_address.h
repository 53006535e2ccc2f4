// The listen addresses of attention-server (--listen, --health-address), checked before
// anything heavy starts (backends, the KV cache, metrics): a typo such as `--listen
// nothost:50051` exits 2 at once with the reason, instead of after the device and the KV cache
// opened. Part of main.cc's start-up; called from the main thread.
#pragma once

#include <string>

#include "attn/common/status.h"

namespace attn::startup {

/// Checks `address`, the value of `flag` ("--listen"), as gRPC will bind it:
///   - "host:port" or "[v6]:port": port digits in [0, 65535] (0: any free port); host an
///     IPv4/IPv6 literal (0.0.0.0, [::]: every interface) or a name that resolves now
///     (getaddrinfo, AI_PASSIVE), so "nothost:50051" is refused; an empty host (":50051") too,
///     as gRPC would ("unparseable host:port");
///   - "unix:PATH" (only when `allow_unix`): PATH non-empty; the rest of its checks are
///     PrepareUnixSocket's (common/unix_socket.h).
/// Binds nothing. Returns OK or InvalidArgument "<flag>: <reason>, got \"<address>\"".
Status CheckListenAddress(const std::string& flag, const std::string& address, bool allow_unix);

}  // namespace attn::startup
