#include "moetron/ckpt/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "moetron/core/error.h"
#include "moetron/core/overwrite_file.h"

namespace moetron::ckpt {

namespace {
constexpr uint64_t kMaxHeader = 100u << 20;  // the format's own limit is 100 MB

float load_float(const void* p, DType t, size_t i) {
  switch (t) {
    case DType::f32:
      return static_cast<const float*>(p)[i];
    case DType::f64:
      return static_cast<float>(static_cast<const double*>(p)[i]);
    case DType::bf16:
      return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::f16:
      return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    default:
      return 0;
  }
}
}  // namespace

std::string safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "F32";
    case DType::bf16:
      return "BF16";
    case DType::f16:
      return "F16";
    case DType::f64:
      return "F64";
    case DType::i32:
      return "I32";
    case DType::i64:
      return "I64";
    case DType::u8:
      return "U8";
  }
  return "?";
}

DType parse_safetensors_dtype(const std::string& name, const std::string& context) {
  for (DType t :
       {DType::f32, DType::bf16, DType::f16, DType::f64, DType::i32, DType::i64, DType::u8}) {
    if (safetensors_dtype_name(t) == name) return t;
  }
  MOETRON_FAIL(context, ": unsupported safetensors dtype '", name, "'");
}

std::string write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> seen;
  size_t offset = 0;
  std::vector<size_t> begins;
  for (const auto& [name, t] : tensors) {
    MOETRON_CHECK(seen.insert(name).second, path, ": duplicate tensor name '", name, "'");
    MOETRON_CHECK(name != "__metadata__", path, ": reserved tensor name");
    offset = (offset + 7) / 8 * 8;
    begins.push_back(offset);
    header[name] = {{"dtype", safetensors_dtype_name(t.dtype())},
                    {"shape", std::vector<int64_t>(t.shape().begin(), t.shape().end())},
                    {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');  // pad so the data starts 8-byte aligned
  // In place: a snapshot rewriting a recycled file keeps its pages.
  OverwriteFile f(path);
  const uint64_t n = json.size();
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  f.write(len, 8);
  f.write(json.data(), json.size());
  size_t pos = 0;
  static const char zeros[8] = {};
  for (size_t i = 0; i < tensors.size(); ++i) {
    f.write(zeros, begins[i] - pos);
    const Tensor& t = tensors[i].tensor;
    f.write(t.raw(), t.nbytes());
    pos = begins[i] + t.nbytes();
  }
  f.finish();
  return f.checksum();
}

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  MOETRON_CHECK(fd >= 0, "cannot open safetensors file '", path, "': ", std::strerror(errno));
  struct stat st {};
  ::fstat(fd, &st);
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    map_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  }
  ::close(fd);
  if (map_ == MAP_FAILED) map_ = nullptr;
  try {
    MOETRON_CHECK(size_ >= 8 && map_ != nullptr, "'", path, "' is too short to be safetensors (",
                  size_, " bytes)");
    const auto* bytes = static_cast<const unsigned char*>(map_);
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(bytes[i]) << (8 * i);
    MOETRON_CHECK(n <= kMaxHeader && 8 + n <= size_, "'", path, "': header length ", n,
                  " exceeds the file (", size_, " bytes): truncated or not safetensors");
    nlohmann::ordered_json header;  // keeps the file's tensor order
    try {
      header = nlohmann::ordered_json::parse(bytes + 8, bytes + 8 + n);
    } catch (const nlohmann::json::exception& e) {
      MOETRON_FAIL("'", path, "': header is not valid JSON: ", e.what());
    }
    MOETRON_CHECK(header.is_object(), "'", path, "': header is not a JSON object");
    const size_t data_start = 8 + n;
    std::vector<std::pair<size_t, size_t>> spans;
    size_t order = 0;
    for (auto it = header.begin(); it != header.end(); ++it) {
      if (it.key() == "__metadata__") {
        for (auto m = it->begin(); m != it->end(); ++m) {
          MOETRON_CHECK(m->is_string(), "'", path, "': metadata value '", m.key(),
                        "' is not a string");
          metadata_[m.key()] = m->get<std::string>();
        }
        continue;
      }
      const std::string ctx = str_cat("'", path, "' tensor '", it.key(), "'");
      try {
        Entry e;
        e.dtype = parse_safetensors_dtype(it->at("dtype").get<std::string>(), ctx);
        for (const auto& d : it->at("shape")) e.shape.push_back(d.get<int64_t>());
        const auto& off = it->at("data_offsets");
        MOETRON_CHECK(off.size() == 2, ctx, ": data_offsets must have 2 entries");
        const auto b = off[0].get<uint64_t>(), en = off[1].get<uint64_t>();
        MOETRON_CHECK(b <= en && data_start + en <= size_, ctx, ": data_offsets [", b, ", ", en,
                      ") run past the end of the file: truncated");
        MOETRON_CHECK(en - b == static_cast<uint64_t>(e.shape.numel()) * dtype_size(e.dtype), ctx,
                      ": ", en - b, " bytes do not match dtype ", safetensors_dtype_name(e.dtype),
                      " x shape ", e.shape.str());
        e.begin = data_start + b;
        e.end = data_start + en;
        e.order = order++;
        spans.emplace_back(e.begin, e.end);
        entries_[it.key()] = e;
      } catch (const nlohmann::json::exception& ex) {
        MOETRON_FAIL(ctx, ": malformed entry: ", ex.what());
      }
    }
    std::sort(spans.begin(), spans.end());
    for (size_t i = 1; i < spans.size(); ++i) {
      MOETRON_CHECK(spans[i].first >= spans[i - 1].second, "'", path,
                    "': tensors overlap in the data section");
    }
  } catch (...) {
    if (map_) ::munmap(map_, size_);
    map_ = nullptr;
    throw;
  }
}

SafetensorsReader::~SafetensorsReader() {
  if (map_) ::munmap(map_, size_);
}

std::vector<std::string> SafetensorsReader::names() const {
  std::vector<std::pair<size_t, std::string>> v;
  for (const auto& [name, e] : entries_) v.emplace_back(e.order, name);
  std::sort(v.begin(), v.end());
  std::vector<std::string> out;
  for (auto& p : v) out.push_back(std::move(p.second));
  return out;
}

const SafetensorsReader::Entry& SafetensorsReader::entry(const std::string& name) const {
  auto it = entries_.find(name);
  MOETRON_CHECK(it != entries_.end(), "'", path_, "' has no tensor '", name, "'");
  return it->second;
}

DType SafetensorsReader::dtype(const std::string& name) const {
  return entry(name).dtype;
}
Shape SafetensorsReader::shape(const std::string& name) const {
  return entry(name).shape;
}

Tensor SafetensorsReader::view(const std::string& name) const {
  const Entry& e = entry(name);
  return Tensor::wrap(static_cast<char*>(map_) + e.begin, e.shape, e.dtype);
}

void SafetensorsReader::read_into(const std::string& name, const Tensor& dst) const {
  const Entry& e = entry(name);
  MOETRON_CHECK(dst.shape() == e.shape, "'", path_, "' tensor '", name, "' has shape ",
                e.shape.str(), ", expected ", dst.shape().str());
  const void* src = static_cast<const char*>(map_) + e.begin;
  if (dst.dtype() == e.dtype) {
    std::memcpy(dst.raw(), src, dst.nbytes());
    return;
  }
  MOETRON_CHECK(is_floating(dst.dtype()) && is_floating(e.dtype), "'", path_, "' tensor '", name,
                "' is ", dtype_name(e.dtype), ", cannot convert to ", dtype_name(dst.dtype()));
  const auto n = static_cast<size_t>(dst.numel());
  for (size_t i = 0; i < n; ++i) {
    const float v = load_float(src, e.dtype, i);
    switch (dst.dtype()) {
      case DType::f32:
        static_cast<float*>(dst.raw())[i] = v;
        break;
      case DType::f64:
        static_cast<double*>(dst.raw())[i] = v;
        break;
      case DType::bf16:
        static_cast<uint16_t*>(dst.raw())[i] = f32_to_bf16(v);
        break;
      case DType::f16:
        static_cast<uint16_t*>(dst.raw())[i] = f32_to_f16(v);
        break;
      default:
        break;
    }
  }
}

}  // namespace moetron::ckpt
