// safetensors reading and writing (the Hugging Face format): 8-byte
// little-endian header length N, N bytes of JSON
// {"name": {"dtype": "BF16", "shape": [...], "data_offsets": [b, e]}, "__metadata__": {...}},
// then the raw little-endian data, offsets relative to the end of the header.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "moetron/core/tensor.h"

namespace moetron::ckpt {

std::string safetensors_dtype_name(DType dtype);  // "F32", "BF16", ...
DType parse_safetensors_dtype(const std::string& name, const std::string& context);

struct NamedTensor {
  std::string name;
  Tensor tensor;
};

// Writes `tensors` (in the given order, data 8-byte aligned) to `path`, which
// is created or overwritten in place (core/overwrite_file.h); the caller
// makes it atomic (see core/staged_dir.h). Returns the file's xxHash64
// (file_checksum's form), computed as it was written. Throws naming the path
// on I/O errors and on duplicate names.
std::string write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

// A safetensors file mapped read-only. Every header field is validated on
// open (offsets inside the file, sizes matching dtype x shape, no overlaps);
// errors name the file and the tensor.
class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path);
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::string& path() const { return path_; }
  std::vector<std::string> names() const;  // in file order
  bool contains(const std::string& name) const { return entries_.count(name) != 0; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  DType dtype(const std::string& name) const;
  Shape shape(const std::string& name) const;
  // A view of the mapped bytes: valid while the reader lives. Read-only in spirit.
  Tensor view(const std::string& name) const;
  // Copies the tensor into `dst`, converting float dtypes if they differ; shapes must match.
  void read_into(const std::string& name, const Tensor& dst) const;

 private:
  struct Entry {
    DType dtype;
    Shape shape;
    size_t begin, end;  // absolute file offsets
    size_t order;
  };
  const Entry& entry(const std::string& name) const;

  std::string path_;
  void* map_ = nullptr;
  size_t size_ = 0;
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace moetron::ckpt
