// Reading a corpus file's bytes: plain files as they are, gzip files
// (Debian's /usr/share/doc/*/changelog.gz, README.gz, ...) decompressed with
// zlib. A file is gzip when it starts with the gzip magic bytes, whatever
// its name.
#pragma once

#include <string>

namespace moetron::data {

// The whole (decompressed) content of `path`; throws naming the path when it
// cannot be read or its gzip stream is damaged.
std::string read_text_file(const std::string& path);

// True when `bytes` starts with the gzip magic (1f 8b).
bool is_gzip(const std::string& bytes);

}  // namespace moetron::data
