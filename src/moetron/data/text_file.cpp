#include "moetron/data/text_file.h"

#include <zlib.h>

#include <fstream>
#include <sstream>

#include "moetron/core/error.h"

namespace moetron::data {

namespace {

// Inflates every member of a gzip stream (gzip files may be concatenations).
std::string gunzip(const std::string& path, const std::string& packed) {
  z_stream zs{};
  // 16 + MAX_WBITS: a gzip header and trailer, not a raw zlib stream.
  MOETRON_CHECK(inflateInit2(&zs, 16 + MAX_WBITS) == Z_OK, "zlib: cannot start inflating '", path,
                "'");
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(packed.data()));
  zs.avail_in = static_cast<uInt>(packed.size());
  std::string out;
  char buf[1 << 16];
  int rc = Z_OK;
  while (true) {
    zs.next_out = reinterpret_cast<Bytef*>(buf);
    zs.avail_out = sizeof(buf);
    rc = inflate(&zs, Z_NO_FLUSH);
    out.append(buf, sizeof(buf) - zs.avail_out);
    if (rc == Z_STREAM_END && zs.avail_in > 0) {
      rc = inflateReset(&zs);  // the next member
      if (rc == Z_OK) continue;
    }
    if (rc != Z_OK) break;
    if (zs.avail_in == 0 && zs.avail_out > 0) break;  // input ended inside a member
  }
  const std::string msg = zs.msg ? zs.msg : "";
  inflateEnd(&zs);
  MOETRON_CHECK(rc == Z_STREAM_END, "gzip file '", path, "' is damaged or truncated",
                msg.empty() ? "" : " (zlib: " + msg + ")");
  return out;
}

}  // namespace

bool is_gzip(const std::string& bytes) {
  return bytes.size() >= 2 && static_cast<unsigned char>(bytes[0]) == 0x1f &&
         static_cast<unsigned char>(bytes[1]) == 0x8b;
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MOETRON_CHECK(in.good(), "cannot read corpus file '", path, "'");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string bytes = ss.str();
  return is_gzip(bytes) ? gunzip(path, bytes) : bytes;
}

}  // namespace moetron::data
