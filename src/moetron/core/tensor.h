// Tensor: a contiguous row-major array with a shape, a dtype and a device.
// A tensor either owns its storage (allocated through the tagged allocator,
// shared between views by reference count) or is a view of memory someone
// else owns (Tensor::wrap). Views of a tensor share its storage; slicing the
// leading dimension and reshaping keep the result contiguous.
//
// The device is that of the allocator (Device::cuda for cuda_allocator(),
// core/device.h) or the one given to wrap(). The host never dereferences a
// device tensor: data<T>() refuses one (kernels take raw() on the device);
// copy_from, zeros, fill, poison and clone work on either, copying
// explicitly between host and device.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "moetron/core/allocator.h"
#include "moetron/core/dtype.h"
#include "moetron/core/error.h"
#include "moetron/core/shape.h"

namespace moetron {

namespace detail {
template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::f32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::f64;
}
template <>
constexpr DType dtype_of<bf16>() {
  return DType::bf16;
}
template <>
constexpr DType dtype_of<f16>() {
  return DType::f16;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::i32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::i64;
}
template <>
constexpr DType dtype_of<uint8_t>() {
  return DType::u8;
}
}  // namespace detail

class Storage {
 public:
  Storage(size_t bytes, MemTag tag, Allocator& alloc);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  MemTag tag() const { return tag_; }

 private:
  void* data_;
  size_t bytes_;
  MemTag tag_;
  Allocator& alloc_;

 public:
  Allocator& allocator() const { return alloc_; }
};

class Tensor {
 public:
  Tensor() = default;  // undefined: defined() is false

  // Uninitialised owning tensor, counted under `tag`.
  static Tensor empty(const Shape& shape, DType dtype, MemTag tag = MemTag::activations,
                      Allocator& alloc = cpu_allocator());
  static Tensor zeros(const Shape& shape, DType dtype, MemTag tag = MemTag::activations,
                      Allocator& alloc = cpu_allocator());
  // Non-owning view of caller memory that must outlive the tensor.
  static Tensor wrap(void* data, const Shape& shape, DType dtype, Device device = Device::cpu);

  bool defined() const { return dtype_set_; }
  const Shape& shape() const { return shape_; }
  int rank() const { return shape_.rank(); }
  int64_t dim(int i) const { return shape_.dim(i); }
  int64_t numel() const { return shape_.numel(); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  size_t element_size() const { return dtype_size(dtype_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * element_size(); }
  bool owns_storage() const { return storage_ != nullptr; }
  // The tag of the owning storage; views of foreign memory report `workspace`.
  MemTag tag() const { return storage_ ? storage_->tag() : MemTag::workspace; }

  void* raw() const { return data_; }
  template <typename T>
  T* data() const {
    MOETRON_CHECK(detail::dtype_of<T>() == dtype_, "tensor of dtype ", dtype_name(dtype_),
                  " accessed as ", dtype_name(detail::dtype_of<T>()));
    MOETRON_CHECK(device_ == Device::cpu, "host access to the elements of ", str(),
                  " (copy it to the host first: clone_to(cpu_allocator()))");
    return static_cast<T*>(data_);
  }

  // Same storage, new shape with the same number of elements.
  Tensor reshape(const Shape& shape) const;
  // Rows [begin, end) of the leading dimension; shares storage.
  Tensor slice(int64_t begin, int64_t end) const;
  // Element i of the leading dimension, rank reduced by one.
  Tensor operator[](int64_t i) const;
  // A copy in new storage from the allocator that owns this tensor's (the host
  // allocator for a view of host memory; a view of device memory has none
  // to name: use clone_to).
  Tensor clone(MemTag tag = MemTag::activations) const;
  // A copy in new storage from `alloc`, on its device: the explicit way
  // between host and device.
  Tensor clone_to(Allocator& alloc, MemTag tag = MemTag::activations) const;
  // Writes go through the handle: a const Tensor is a fixed view, not
  // read-only data (kernels take outputs as const Tensor&).
  // Copies src into this tensor (same shape and dtype; either may be on the
  // host or the device, see copy_bytes in core/device.h for the ordering).
  void copy_from(const Tensor& src) const;
  // Fills every element with `value` converted to the dtype.
  void fill(double value) const;
  // Fills every byte of every element with 0xff: NaN for f32/f64/bf16/f16,
  // -1 for integers. Tests poison outputs so an element never written fails.
  void poison() const;

  std::string str() const;  // "f32[2, 3]", "f32[2, 3]@cuda" on the device

 private:
  std::shared_ptr<Storage> storage_;
  void* data_ = nullptr;
  Shape shape_;
  DType dtype_ = DType::f32;
  Device device_ = Device::cpu;
  bool dtype_set_ = false;
};

// Checks a tensor's shape and dtype, naming the argument in the error.
void check_tensor(const Tensor& t, const char* name, const Shape& shape, DType dtype);
void check_shape(const Tensor& t, const char* name, const Shape& shape);

}  // namespace moetron
