#include "moetron/kernels/f16_staging.h"

#include "moetron/kernels/elementwise.h"

namespace moetron::kernels {

bool needs_f16_staging(const Context& ctx, std::initializer_list<const Tensor*> tensors) {
  if (ctx.backend() != Backend::cpu) return false;
  for (const Tensor* t : tensors) {
    if (t->defined() && t->dtype() == DType::f16) return true;
  }
  return false;
}

F16Staging::Entry& F16Staging::staged(const Tensor& t, bool fill) {
  Entry* e = nullptr;
  for (auto& x : entries_) {
    if (x.original.raw() == t.raw() && x.original.numel() == t.numel()) e = &x;
  }
  if (e == nullptr) {
    entries_.push_back({t, Tensor::empty(t.shape(), DType::f32, MemTag::workspace)});
    e = &entries_.back();
  }
  if (fill && !e->filled) {
    cpu::convert(ctx_, t, e->copy);
    e->filled = true;
  }
  return *e;
}

Tensor F16Staging::in(const Tensor& t) {
  if (!t.defined() || t.dtype() != DType::f16) return t;
  return staged(t, true).copy;
}

Tensor F16Staging::out(const Tensor& t, bool read) {
  if (!t.defined() || t.dtype() != DType::f16) return t;
  Entry& e = staged(t, read);
  e.output = true;
  return e.copy;
}

void F16Staging::finish() {
  for (auto& e : entries_) {
    if (e.output) cpu::convert(ctx_, e.copy, e.original);
    e.output = false;
  }
}

}  // namespace moetron::kernels
