#include "moetron/parallel/bucket_plan.h"

#include <algorithm>
#include <memory>

#include "moetron/core/error.h"

namespace moetron::parallel {

namespace {

void pad_to(PlannedBucket& b, int n) {
  b.numel = (b.numel + n - 1) / n * n;
}

double matrix_cost(const nn::ParamInfo& p) {
  return newton_schulz_cost(p.rows(), p.cols());
}

// FlexMuon's owner buckets: each group's matrices dealt to the rank with the
// least Newton-Schulz work so far (largest first); rank r's chunk holds
// exactly its matrices, every chunk padded to the largest.
class OwnerPlanner {
 public:
  OwnerPlanner(const std::vector<nn::ParamInfo>& params, int n, int64_t bucket_bytes)
      : params_(params), n_(n), bucket_bytes_(bucket_bytes), load_(static_cast<size_t>(n), 0.0) {}

  void add_owned(size_t i) {
    MOETRON_CHECK(params_[i].shape.rank() == 2, "owner-based buckets hold matrices; '",
                  params_[i].name, "' is ", params_[i].shape.str());
    group_.push_back(i);
    group_numel_ += params_[i].numel();
    if (group_numel_ * 4 >= bucket_bytes_) close_group();
  }
  void add_flat(size_t i) {
    flat_.slots.push_back({i, flat_.numel, params_[i].numel(), -1});
    flat_.numel += params_[i].numel();
    if (flat_.numel * 4 >= bucket_bytes_) close_flat();
  }
  std::vector<PlannedBucket> finish() {
    close_group();
    close_flat();
    return std::move(out_);
  }

 private:
  void close_group() {
    if (group_.empty()) return;
    std::vector<size_t> order = group_;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return matrix_cost(params_[a]) > matrix_cost(params_[b]);
    });
    std::vector<std::vector<size_t>> per_rank(static_cast<size_t>(n_));
    for (size_t i : order) {
      const auto r =
          static_cast<size_t>(std::min_element(load_.begin(), load_.end()) - load_.begin());
      load_[r] += matrix_cost(params_[i]);
      per_rank[r].push_back(i);
    }
    int64_t chunk = 1;
    for (const auto& ps : per_rank) {
      int64_t sum = 0;
      for (size_t i : ps) sum += params_[i].numel();
      chunk = std::max(chunk, sum);
    }
    PlannedBucket b;
    for (size_t r = 0; r < per_rank.size(); ++r) {
      int64_t off = static_cast<int64_t>(r) * chunk;
      for (size_t i : per_rank[r]) {
        b.slots.push_back({i, off, params_[i].numel(), static_cast<int>(r)});
        off += params_[i].numel();
      }
    }
    b.numel = chunk * n_;
    out_.push_back(std::move(b));
    group_.clear();
    group_numel_ = 0;
  }
  void close_flat() {
    if (flat_.slots.empty()) return;
    pad_to(flat_, n_);
    out_.push_back(std::move(flat_));
    flat_ = PlannedBucket{};
  }

  const std::vector<nn::ParamInfo>& params_;
  int n_;
  int64_t bucket_bytes_;
  std::vector<double> load_;  // Newton-Schulz cost per rank, all buckets
  std::vector<size_t> group_;
  int64_t group_numel_ = 0;
  PlannedBucket flat_;
  std::vector<PlannedBucket> out_;
};

// A predicate on nn::Parameter as one on the description `desc` of `params`
// (describe_parameters keeps their order: element i describes params.all()[i]).
ParamFilter on_parameters(const nn::ParameterSet& params, const std::vector<nn::ParamInfo>& desc,
                          const std::function<bool(const nn::Parameter&)>& f) {
  if (!f) return {};
  auto keep = std::make_shared<std::vector<char>>();
  for (const auto& p : params.all()) keep->push_back(f(*p) ? 1 : 0);
  const nn::ParamInfo* base = desc.data();
  return [keep, base](const nn::ParamInfo& info) {
    return (*keep)[static_cast<size_t>(&info - base)] != 0;
  };
}

}  // namespace

std::vector<PlannedBucket> flat_bucket_plan(const std::vector<nn::ParamInfo>& params, int n,
                                            int64_t bucket_bytes, const ParamFilter& include) {
  MOETRON_CHECK(bucket_bytes > 0, "gradient bucket size must be positive, got ", bucket_bytes);
  std::vector<PlannedBucket> out;
  PlannedBucket cur;
  for (size_t i = params.size(); i-- > 0;) {
    if (include && !include(params[i])) continue;
    cur.slots.push_back({i, cur.numel, params[i].numel(), -1});
    cur.numel += params[i].numel();
    if (cur.numel * 4 >= bucket_bytes) {
      pad_to(cur, n);
      out.push_back(std::move(cur));
      cur = PlannedBucket{};
    }
  }
  if (!cur.slots.empty()) {
    pad_to(cur, n);
    out.push_back(std::move(cur));
  }
  return out;
}

std::vector<PlannedBucket> owner_bucket_plan(const std::vector<nn::ParamInfo>& params, int n,
                                             int64_t bucket_bytes, const ParamFilter& owned,
                                             const ParamFilter& include) {
  MOETRON_CHECK(bucket_bytes > 0, "gradient bucket size must be positive, got ", bucket_bytes);
  OwnerPlanner planner(params, n, bucket_bytes);
  for (size_t i = params.size(); i-- > 0;) {
    if (include && !include(params[i])) continue;
    if (owned(params[i])) {
      planner.add_owned(i);
    } else {
      planner.add_flat(i);
    }
  }
  return planner.finish();
}

std::vector<BucketSpec> bind_buckets(const std::vector<PlannedBucket>& plan,
                                     const nn::ParameterSet& params) {
  std::vector<BucketSpec> out;
  for (const PlannedBucket& pb : plan) {
    BucketSpec b;
    b.numel = pb.numel;
    for (const PlannedSlot& s : pb.slots) {
      MOETRON_CHECK(s.param < params.all().size(), "bucket plan names parameter ", s.param, " of ",
                    params.all().size());
      nn::Parameter* p = params.all()[s.param].get();
      MOETRON_CHECK(p->grad.numel() == s.numel, "bucket plan: '", p->name, "' has ",
                    p->grad.numel(), " elements, planned ", s.numel);
      b.slots.push_back({p, s.offset, s.numel, s.owner});
    }
    out.push_back(std::move(b));
  }
  return out;
}

std::vector<BucketSpec> flat_bucket_plan(const nn::ParameterSet& params, int dp,
                                         int64_t bucket_bytes,
                                         const std::function<bool(const nn::Parameter&)>& include) {
  const std::vector<nn::ParamInfo> desc = nn::describe_parameters(params);
  return bind_buckets(
      flat_bucket_plan(desc, dp, bucket_bytes, on_parameters(params, desc, include)), params);
}

double newton_schulz_cost(int64_t m, int64_t n) {
  const auto s = static_cast<double>(std::min(m, n)), l = static_cast<double>(std::max(m, n));
  return 2.0 * s * s * l + s * s * s;
}

std::vector<BucketSpec> owner_bucket_plan(
    const nn::ParameterSet& params, int dp, int64_t bucket_bytes,
    const std::function<bool(const nn::Parameter&)>& owned,
    const std::function<bool(const nn::Parameter&)>& include) {
  const std::vector<nn::ParamInfo> desc = nn::describe_parameters(params);
  return bind_buckets(owner_bucket_plan(desc, dp, bucket_bytes, on_parameters(params, desc, owned),
                                        on_parameters(params, desc, include)),
                      params);
}

int64_t max_chunk_share(const std::vector<std::pair<int64_t, int64_t>>& ranges, int64_t chunk,
                        int64_t n) {
  int64_t most = 0;
  for (int64_t r = 0; r < n; ++r) {
    const int64_t lo = r * chunk, hi = lo + chunk;
    int64_t held = 0;
    for (const auto& [offset, numel] : ranges)
      held += std::max<int64_t>(0, std::min(hi, offset + numel) - std::max(lo, offset));
    most = std::max(most, held);
  }
  return most;
}

}  // namespace moetron::parallel
