#include "moetron/train/fault_injection.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "moetron/core/error.h"

namespace moetron::train {
namespace {

TEST(FaultInjection, ParsesRankAndStepInEitherOrder) {
  EXPECT_FALSE(parse_injected_failure("").has_value());
  auto f = parse_injected_failure("rank=1,step=0");
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->rank, 1);
  EXPECT_EQ(f->step, 0);
  f = parse_injected_failure("step=12,rank=3");
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->rank, 3);
  EXPECT_EQ(f->step, 12);
}

TEST(FaultInjection, MalformedValuesNameTheVariableAndTheProblem) {
  const std::pair<const char*, const char*> cases[] = {
      {"rank=1", "'step' is missing"},         {"step=2", "'rank' is missing"},
      {"rank=x,step=2", "rank 'x'"},           {"rank=1,step=-3", "step '-3'"},
      {"rank=1,step=2,rank=0", "given twice"}, {"rank=1,stp=2", "unknown key 'stp'"},
      {"rank=1;step=2", "not an integer"},     {"rank 1", "not key=value"},
  };
  for (const auto& [spec, why] : cases) {
    try {
      parse_injected_failure(spec);
      ADD_FAILURE() << spec << " was accepted";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("MOETRON_INJECT_FAILURE='" + std::string(spec) + "' is malformed"),
                std::string::npos)
          << msg;
      EXPECT_NE(msg.find(why), std::string::npos) << spec << ": " << msg;
    }
  }
}

TEST(FaultInjection, ThrowsOnlyOnTheNamedRankAndStep) {
  ::unsetenv(kInjectFailureEnv);
  EXPECT_NO_THROW(maybe_inject_failure(1, 0));
  ::setenv(kInjectFailureEnv, "rank=1,step=4", 1);
  EXPECT_NO_THROW(maybe_inject_failure(0, 4));
  EXPECT_NO_THROW(maybe_inject_failure(1, 3));
  try {
    maybe_inject_failure(1, 4);
    ADD_FAILURE() << "no failure injected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("injected failure on rank 1 at step 4"), std::string::npos)
        << e.what();
  }
  ::setenv(kInjectFailureEnv, "rank=one", 1);
  EXPECT_THROW(maybe_inject_failure(0, 0), Error);  // malformed: an error on every rank
  ::unsetenv(kInjectFailureEnv);
}

}  // namespace
}  // namespace moetron::train
