// AdamW in double, exactly the formula of adamw.h; state is rounded into
// its own dtype once per step (m and v: the master's dtype or bf16), after
// the update has used the unrounded moments. A bf16 master is rounded to
// fp32 first (as the fp32 backends hold it), then stochastically to bf16
// with the same bits as every backend.
#include <cmath>

#include "moetron/kernels/adamw.h"
#include "moetron/kernels/reference/ref_util.h"

namespace moetron::kernels::reference {

void adamw_step(Context&, const Tensor& master, const Tensor& grad, const Tensor& m,
                const Tensor& v, const AdamWArgs& args, const Tensor& param_copy) {
  MOETRON_CHECK(args.step >= 1, "adamw_step: step is 1-based, got ", args.step);
  MOETRON_CHECK(master.rank() == 1 && is_floating(master.dtype()),
                "adamw_step: master must be a float [n] tensor, got ", master.str());
  const Shape shape = master.shape();
  check_shape(grad, "adamw grad", shape);
  check_shape(m, "adamw m", shape);
  check_tensor(v, "adamw v", shape, m.dtype());
  const bool bf16_master = master.dtype() == DType::bf16;
  MOETRON_CHECK(m.dtype() == master.dtype() || m.dtype() == DType::bf16 ||
                    (bf16_master && m.dtype() == DType::f32),
                "adamw_step: m and v must be in the master's dtype or bf16, got ", m.str());
  MOETRON_CHECK(!bf16_master || !param_copy.defined(),
                "adamw_step: a bf16 master is the working copy itself; got a param_copy");
  MOETRON_CHECK(is_floating(grad.dtype()), "adamw_step: grad must be a float tensor, got ",
                grad.str());
  if (param_copy.defined()) check_shape(param_copy, "adamw param_copy", shape);
  const double b1 = args.beta1, b2 = args.beta2, lr = args.lr, wd = args.weight_decay;
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(args.step));
  const bool frozen = args.variance_frozen();
  const double bc2 = 1.0 - std::pow(b2, static_cast<double>(args.variance_step()));
  for (int64_t i = 0; i < master.numel(); ++i) {
    const double g = static_cast<double>(args.grad_scale) * load(grad, i);
    const double mi = b1 * load(m, i) + (1.0 - b1) * g;
    const double vi = frozen ? load(v, i) : b2 * load(v, i) + (1.0 - b2) * g * g;
    const double w = load(master, i);
    const double update = (mi / bc1) / (std::sqrt(vi / bc2) + static_cast<double>(args.eps));
    const double w_new = w - lr * (wd * w + update);
    store(m, i, mi);
    store(v, i, vi);
    store_master(master, i, w_new, args.rounding_key);
    if (param_copy.defined()) store(param_copy, i, w_new);
  }
}

}  // namespace moetron::kernels::reference
