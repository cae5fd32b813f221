// A directory's manifest (checkpoints, prepared corpora): every file with its
// size and xxHash64, plus free-form JSON state (step, layout, RNG, counts).
// The directory is complete only if every listed file matches its checksum.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace moetron {

inline constexpr const char* kManifestName = "manifest.json";

// xxHash64 of the file's bytes as 16 hex digits; throws naming the path.
std::string file_checksum(const std::string& path);

// Writes dir/manifest.json listing `files` (names relative to dir) with their
// sizes and checksums, and `extra` under "state". `known`: checksums the
// writer computed as it wrote (by name); the other files are read back.
void write_manifest(const std::string& dir, const std::vector<std::string>& files,
                    const nlohmann::json& extra,
                    const std::map<std::string, std::string>& known = {});

// Reads the manifest and verifies every file's size and checksum; returns the
// "state" object. Throws moetron::Error naming the first missing, truncated or
// corrupt file, called a `kind` file ("checkpoint", "corpus").
nlohmann::json verify_manifest(const std::string& dir, const std::string& kind = "checkpoint");

}  // namespace moetron
