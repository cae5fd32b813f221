#include "moetron/core/manifest.h"

#include <xxhash.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

#include "moetron/core/error.h"

namespace moetron {

namespace fs = std::filesystem;

std::string file_checksum(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  MOETRON_CHECK(f != nullptr, "cannot open '", path, "' to checksum");
  XXH64_state_t* st = XXH64_createState();
  XXH64_reset(st, 0);
  std::vector<char> buf(1 << 20);
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) XXH64_update(st, buf.data(), n);
  const bool err = std::ferror(f) != 0;
  std::fclose(f);
  const uint64_t h = XXH64_digest(st);
  XXH64_freeState(st);
  MOETRON_CHECK(!err, "read error while checksumming '", path, "'");
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

void write_manifest(const std::string& dir, const std::vector<std::string>& files,
                    const nlohmann::json& extra, const std::map<std::string, std::string>& known) {
  nlohmann::json m;
  m["format"] = "moetron-manifest/1";
  m["files"] = nlohmann::json::object();
  for (const auto& name : files) {
    const std::string p = dir + "/" + name;
    const auto k = known.find(name);
    m["files"][name] = {{"bytes", fs::file_size(p)},
                        {"xxh64", k != known.end() ? k->second : file_checksum(p)}};
  }
  m["state"] = extra;
  const std::string path = dir + "/" + kManifestName;
  std::ofstream f(path, std::ios::trunc);
  f << m.dump(2) << "\n";
  f.flush();
  MOETRON_CHECK(f.good(), "cannot write '", path, "'");
}

nlohmann::json verify_manifest(const std::string& dir, const std::string& kind) {
  const std::string path = dir + "/" + kManifestName;
  std::ifstream f(path);
  MOETRON_CHECK(f.good(), kind, " '", dir, "' has no ", kManifestName);
  nlohmann::json m;
  try {
    m = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    MOETRON_FAIL("'", path, "' is not valid JSON: ", e.what());
  }
  MOETRON_CHECK(m.value("format", "") == "moetron-manifest/1", "'", path,
                "' is not a moetron manifest");
  for (const auto& [name, info] : m.at("files").items()) {
    const std::string p = dir + "/" + name;
    MOETRON_CHECK(fs::exists(p), kind, " file '", p, "' is missing");
    const auto bytes = info.at("bytes").get<uintmax_t>();
    MOETRON_CHECK(fs::file_size(p) == bytes, kind, " file '", p, "' has ", fs::file_size(p),
                  " bytes, the manifest says ", bytes, ": truncated");
    MOETRON_CHECK(file_checksum(p) == info.at("xxh64").get<std::string>(), kind, " file '", p,
                  "' fails its checksum: corrupt");
  }
  return m.value("state", nlohmann::json::object());
}

}  // namespace moetron
