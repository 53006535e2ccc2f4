// Sequence ids that name their replica (DESIGN.md §12, sequence.proto SequenceInfo.sequence_id).
//
// An id is 32 lowercase hex digits: the first 8 are the *replica tag* of the server process that
// created the sequence (a random 32-bit value drawn once at start and reported by
// GetServerInfo.replica and GetLoad), the other 24 are 96 random bits (unguessable). The id
// stays opaque to clients and keeps its old format; a router or client that knows each
// replica's tag sends every call on a sequence to the replica whose tag prefixes its id.
// A fresh tag per process means a replica that restarts (even at the same address) never
// accepts ids minted before the restart: they get NOT_FOUND naming the tag.
// Thread-safety: the functions are pure except the random draws (std::random_device).
#pragma once

#include <cstdint>
#include <random>
#include <string>

namespace attn {

constexpr size_t kSequenceIdHexDigits = 32;
constexpr size_t kReplicaTagHexDigits = 8;

/// A random replica tag from std::random_device (/dev/urandom); drawn once per process.
uint32_t NewReplicaTag();

/// `tag` as 8 lowercase hex digits, most significant first (e.g. 0x1a2b3c4d → "1a2b3c4d").
std::string ReplicaTagHex(uint32_t tag);

/// A new id: ReplicaTagHex(tag) followed by 24 random lowercase hex digits drawn from `rd`.
std::string NewSequenceId(uint32_t tag, std::random_device &rd);

/// True when `id` has the id format: exactly 32 characters in [0-9a-f].
bool IsSequenceId(const std::string &id);

/// The replica tag (8 hex digits) that prefixes a well-formed id; "" when `id` is malformed.
std::string ReplicaTagOfId(const std::string &id);

}  // namespace attn
