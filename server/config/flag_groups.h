// Sections of attention-server's --help screen: every flag belongs to one group (CLI11 group),
// so the ~60 flags read as Network, Backends & GPU, Batching, ... instead of one list.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace attn {

/// Every group heading (--help orders groups by the first flag of each).
const std::vector<std::string>& ServerFlagGroups();

/// Puts every option of `app` in its group by long name (help and version in "General").
/// Options already hidden (group "") stay hidden; an option missing from the table keeps
/// CLI11's default group "Options", which the flag tests refuse.
void AssignServerFlagGroups(CLI::App& app);

}  // namespace attn
