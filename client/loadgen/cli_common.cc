#include "loadgen/cli_common.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>

#ifndef ATTN_LOADGEN_DATA_DIR
#define ATTN_LOADGEN_DATA_DIR ""
#endif

namespace attn::loadgen {

bool FileExists(const std::string& path) { return std::ifstream(path).good(); }

std::string ExecutableDir() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  const std::string path(buf, static_cast<size_t>(n));
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

bool WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  return static_cast<bool>(out);
}

void AddSecurityFlags(CLI::App* app, ChannelSecurity* s) {
  app->add_flag("--tls", s->tls, "Connect with TLS (system roots unless --tls-ca)");
  app->add_option("--tls-ca", s->ca_file, "PEM CA certificates that sign the server's (TLS)");
  app->add_option("--tls-cert", s->cert_file, "PEM client certificate (mutual TLS; --tls-key)");
  app->add_option("--tls-key", s->key_file, "PEM private key of --tls-cert");
  app->add_option("--tls-server-name", s->server_name,
                  "Name checked against the server certificate (default: the target host)");
  app->add_option("--token-file", s->token_file,
                  "File holding a bearer token sent as \"authorization: Bearer <token>\"");
}

std::string DefaultTracePath(const std::string& name) {
  const std::string exe_dir = ExecutableDir();
  const std::vector<std::string> candidates = {
      std::string(ATTN_LOADGEN_DATA_DIR) + "/" + name, exe_dir + "/data/" + name,
      exe_dir + "/../data/" + name, exe_dir + "/../share/attention-server/data/" + name};
  for (const auto& c : candidates) {
    if (FileExists(c)) return c;
  }
  return candidates.front();
}

std::string BaseName(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string Trim(double x) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", x);
  return buf;
}

}  // namespace attn::loadgen
