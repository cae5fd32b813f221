#include "moetron/kernels/reference/ref_util.h"

#include "moetron/kernels/stochastic_round.h"
namespace moetron::kernels::reference {

double load(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::f32:
      return static_cast<const float*>(t.raw())[i];
    case DType::f64:
      return static_cast<const double*>(t.raw())[i];
    case DType::bf16:
      return bf16_to_f32(static_cast<const uint16_t*>(t.raw())[i]);
    case DType::f16:
      return f16_to_f32(static_cast<const uint16_t*>(t.raw())[i]);
    case DType::i32:
      return static_cast<const int32_t*>(t.raw())[i];
    case DType::i64:
      return static_cast<double>(static_cast<const int64_t*>(t.raw())[i]);
    case DType::u8:
      return static_cast<const uint8_t*>(t.raw())[i];
  }
  return 0;
}

std::vector<double> load_all(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[static_cast<size_t>(i)] = load(t, i);
  return v;
}

void store(const Tensor& t, int64_t i, double v) {
  switch (t.dtype()) {
    case DType::f32:
      static_cast<float*>(t.raw())[i] = static_cast<float>(v);
      return;
    case DType::f64:
      static_cast<double*>(t.raw())[i] = v;
      return;
    case DType::bf16:
      static_cast<uint16_t*>(t.raw())[i] = f32_to_bf16(static_cast<float>(v));
      return;
    case DType::f16:
      static_cast<uint16_t*>(t.raw())[i] = f32_to_f16(static_cast<float>(v));
      return;
    default:
      MOETRON_FAIL("reference store into non-float tensor ", t.str());
  }
}

void store_master(const Tensor& t, int64_t i, double v, uint32_t key) {
  if (t.dtype() != DType::bf16) return store(t, i, v);
  t.data<bf16>()[i].bits = bf16_stochastic(static_cast<float>(v), key, i);
}

void store_all(const Tensor& t, const std::vector<double>& v) {
  MOETRON_CHECK(static_cast<int64_t>(v.size()) == t.numel(), "store_all of ", v.size(),
                " values into ", t.str());
  for (int64_t i = 0; i < t.numel(); ++i) store(t, i, v[static_cast<size_t>(i)]);
}

std::vector<int64_t> load_ids(const Tensor& t) {
  MOETRON_CHECK(t.dtype() == DType::i32 || t.dtype() == DType::i64, "ids must be i32 or i64, got ",
                t.str());
  std::vector<int64_t> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) {
    v[static_cast<size_t>(i)] = t.dtype() == DType::i32 ? static_cast<const int32_t*>(t.raw())[i]
                                                        : static_cast<const int64_t*>(t.raw())[i];
  }
  return v;
}

}  // namespace moetron::kernels::reference
