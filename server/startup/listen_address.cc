#include "startup/listen_address.h"

#include <netdb.h>
#include <sys/socket.h>

#include "common/unix_socket.h"
#include "startup/main_listener.h"

namespace attn::startup {
namespace {

// The host part of "host:port" or "[v6]:port" (brackets removed); false when a bracket is
// unbalanced or an unbracketed host holds a ':' (an IPv6 literal needs brackets). An empty
// host (":50051") is returned empty: gRPC refuses it ("unparseable host:port").
bool HostOf(const std::string& address, std::string* host) {
  const std::string h = address.substr(0, address.rfind(':'));
  if (!h.empty() && h.front() == '[') {
    if (h.size() < 2 || h.back() != ']') return false;
    *host = h.substr(1, h.size() - 2);
    return !host->empty();
  }
  if (h.find_first_of("[]:") != std::string::npos) return false;
  *host = h;
  return true;
}

}  // namespace

Status CheckListenAddress(const std::string& flag, const std::string& address, bool allow_unix) {
  const std::string got = ", got \"" + address + "\"";
  if (IsUnixAddress(address)) {
    if (!allow_unix) return InvalidArgument(flag + ": expected host:port (no unix: socket)" + got);
    if (UnixSocketPath(address).empty()) {
      return InvalidArgument(flag + ": expected unix:PATH with a non-empty PATH" + got);
    }
    return Status::Ok();
  }
  const std::string forms = allow_unix ? "host:port or unix:PATH" : "host:port";
  std::string host;
  if (ListenPort(address) < 0 || !HostOf(address, &host) || host.empty()) {
    return InvalidArgument(flag + ": expected " + forms +
                           " with port in [0, 65535] (IPv6: [addr]:port)" + got);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string port = address.substr(address.rfind(':') + 1);
  const int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &found);
  if (found != nullptr) freeaddrinfo(found);
  if (rc != 0) {
    return InvalidArgument(flag + ": host \"" + host + "\" does not resolve (" + gai_strerror(rc) +
                           "); use an address of this machine, a name that resolves, or "
                           "0.0.0.0 / [::] for every interface" + got);
  }
  return Status::Ok();
}

}  // namespace attn::startup
