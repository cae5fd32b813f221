#include "moetron/core/tensor.h"

#include <cstring>

#include "moetron/core/device.h"

namespace moetron {

Storage::Storage(size_t bytes, MemTag tag, Allocator& alloc)
    : data_(alloc.allocate(bytes, tag)), bytes_(bytes), tag_(tag), alloc_(alloc) {}

Storage::~Storage() {
  alloc_.deallocate(data_, bytes_, tag_);
}

Tensor Tensor::empty(const Shape& shape, DType dtype, MemTag tag, Allocator& alloc) {
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.dtype_set_ = true;
  t.device_ = alloc.device();
  t.storage_ =
      std::make_shared<Storage>(static_cast<size_t>(shape.numel()) * dtype_size(dtype), tag, alloc);
  t.data_ = t.storage_->data();
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, MemTag tag, Allocator& alloc) {
  Tensor t = empty(shape, dtype, tag, alloc);
  set_bytes(t.data_, t.device_, 0, t.nbytes());
  return t;
}

Tensor Tensor::wrap(void* data, const Shape& shape, DType dtype, Device device) {
  MOETRON_CHECK(data != nullptr || shape.numel() == 0, "wrap of a null pointer with shape ",
                shape.str());
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.dtype_set_ = true;
  t.device_ = device;
  t.data_ = data;
  return t;
}

Tensor Tensor::reshape(const Shape& shape) const {
  MOETRON_CHECK(shape.numel() == numel(), "cannot reshape ", str(), " to ", shape.str());
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::slice(int64_t begin, int64_t end) const {
  MOETRON_CHECK(rank() >= 1, "slice of a scalar tensor");
  MOETRON_CHECK(0 <= begin && begin <= end && end <= shape_[0], "slice [", begin, ", ", end,
                ") out of range for ", str());
  Tensor t = *this;
  const int64_t row = shape_[0] ? numel() / shape_[0] : 0;
  t.shape_[0] = end - begin;
  t.data_ = static_cast<char*>(data_) + static_cast<size_t>(begin * row) * element_size();
  return t;
}

Tensor Tensor::operator[](int64_t i) const {
  Tensor row = slice(i, i + 1);
  Shape s;
  for (int d = 1; d < rank(); ++d) s.push_back(shape_[d]);
  row.shape_ = s;
  return row;
}

Tensor Tensor::clone(MemTag tag) const {
  if (storage_) return clone_to(storage_->allocator(), tag);
  MOETRON_CHECK(device_ == Device::cpu, "clone of ", str(),
                ", a view of device memory: name the allocator with clone_to");
  return clone_to(cpu_allocator(), tag);
}

Tensor Tensor::clone_to(Allocator& alloc, MemTag tag) const {
  Tensor t = empty(shape_, dtype_, tag, alloc);
  t.copy_from(*this);
  return t;
}

void Tensor::copy_from(const Tensor& src) const {
  MOETRON_CHECK(src.shape_ == shape_ && src.dtype_ == dtype_, "copy_from ", src.str(), " into ",
                str());
  if (nbytes() == 0) return;
  if (device_ == Device::cpu && src.device_ == Device::cpu) {
    std::memmove(data_, src.data_, nbytes());
  } else {
    copy_bytes(data_, device_, src.data_, src.device_, nbytes());
  }
}

void Tensor::fill(double value) const {
  if (device_ != Device::cpu) {
    // Filled on the host and copied: fill is for initialisation and tests,
    // not a hot path, and core/ has no device kernels.
    Tensor host = empty(shape_, dtype_, MemTag::workspace);
    host.fill(value);
    copy_from(host);
    return;
  }
  const int64_t n = numel();
  switch (dtype_) {
    case DType::f32: {
      auto* p = static_cast<float*>(data_);
      for (int64_t i = 0; i < n; ++i) p[i] = static_cast<float>(value);
      break;
    }
    case DType::f64: {
      auto* p = static_cast<double*>(data_);
      for (int64_t i = 0; i < n; ++i) p[i] = value;
      break;
    }
    case DType::bf16: {
      const uint16_t b = f32_to_bf16(static_cast<float>(value));
      auto* p = static_cast<uint16_t*>(data_);
      for (int64_t i = 0; i < n; ++i) p[i] = b;
      break;
    }
    case DType::f16: {
      const uint16_t h = f32_to_f16(static_cast<float>(value));
      auto* p = static_cast<uint16_t*>(data_);
      for (int64_t i = 0; i < n; ++i) p[i] = h;
      break;
    }
    case DType::i32: {
      auto* p = static_cast<int32_t*>(data_);
      for (int64_t i = 0; i < n; ++i) p[i] = static_cast<int32_t>(value);
      break;
    }
    case DType::i64: {
      auto* p = static_cast<int64_t*>(data_);
      for (int64_t i = 0; i < n; ++i) p[i] = static_cast<int64_t>(value);
      break;
    }
    case DType::u8: {
      auto* p = static_cast<uint8_t*>(data_);
      for (int64_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(value);
      break;
    }
  }
}

void Tensor::poison() const {
  set_bytes(data_, device_, 0xff, nbytes());
}

std::string Tensor::str() const {
  if (device_ == Device::cpu) return str_cat(dtype_name(dtype_), shape_.str());
  return str_cat(dtype_name(dtype_), shape_.str(), "@", device_name(device_));
}

void check_shape(const Tensor& t, const char* name, const Shape& shape) {
  MOETRON_CHECK(t.shape() == shape, name, " has shape ", t.shape().str(), ", expected ",
                shape.str());
}

void check_tensor(const Tensor& t, const char* name, const Shape& shape, DType dtype) {
  check_shape(t, name, shape);
  MOETRON_CHECK(t.dtype() == dtype, name, " has dtype ", dtype_name(t.dtype()), ", expected ",
                dtype_name(dtype));
}

}  // namespace moetron
