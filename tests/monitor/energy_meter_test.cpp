// The energy meter's RAPL side on a directory laid out as Linux's powercap
// sysfs is (zones intel-rapl:N and sub-zones intel-rapl:N:M, each with
// name, energy_uj and max_energy_range_uj): this machine exposes no RAPL and
// no GPU, so the counters are written by the test, in the kernel's format.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "moetron/monitor/energy_meter.h"
#include "moetron/monitor/metric_registry.h"
#include "moetron/train/training_metrics.h"
#include "util/device_util.h"
#include "util/subprocess.h"

namespace moetron::monitor {
namespace {

namespace fs = std::filesystem;

constexpr double kRange = 262143328850.0;  // a real package's max_energy_range_uj

void write(const fs::path& p, const std::string& text) {
  std::ofstream(p) << text << "\n";
}

void zone(const fs::path& root, const std::string& dir, const std::string& name, double uj) {
  fs::create_directories(root / dir);
  write(root / dir / "name", name);
  write(root / dir / "energy_uj", std::to_string(static_cast<int64_t>(uj)));
  write(root / dir / "max_energy_range_uj", std::to_string(static_cast<int64_t>(kRange)));
}

void set_energy(const fs::path& root, const std::string& dir, double uj) {
  write(root / dir / "energy_uj", std::to_string(static_cast<int64_t>(uj)));
}

// Two packages with core and dram sub-zones, a platform (psys) zone, and an
// MMIO zone of another control type that the meter must ignore.
fs::path two_socket_machine() {
  const fs::path root = test::fresh_temp_dir("powercap");
  zone(root, "intel-rapl:0", "package-0", 1e6);
  zone(root, "intel-rapl:0:0", "core", 5e5);
  zone(root, "intel-rapl:0:1", "dram", 2e5);
  zone(root, "intel-rapl:1", "package-1", 3e6);
  zone(root, "intel-rapl:1:0", "dram", 1e5);
  zone(root, "intel-rapl:2", "psys", 9e6);
  zone(root, "intel-rapl-mmio:0", "package-0", 0);
  return root;
}

TEST(EnergyMeter, FindsEveryRaplZoneAndNamesSubZonesByTheirPackage) {
  const EnergyMeter meter(two_socket_machine().string(), /*use_nvml=*/false);
  ASSERT_TRUE(meter.available());
  const std::vector<std::string> want = {"package-0", "core-0", "dram-0",
                                         "package-1", "dram-1", "psys"};
  EXPECT_EQ(meter.domains(), want);
  EXPECT_NE(meter.describe().find("RAPL package-0, core-0"), std::string::npos) << meter.describe();
}

TEST(EnergyMeter, ReadsJoulesSinceTheLastReadAndUndoesAWrap) {
  const fs::path root = two_socket_machine();
  EnergyMeter meter(root.string(), false);
  set_energy(root, "intel-rapl:0", 1e6 + 25e6);    // +25 J
  set_energy(root, "intel-rapl:0:1", 2e5 + 3e6);   // +3 J
  set_energy(root, "intel-rapl:1", kRange - 1e6);  // near the top: the next read wraps
  std::vector<EnergyDelta> d = meter.read();
  ASSERT_EQ(d.size(), 6u);
  EXPECT_EQ(d[0].domain, "package-0");
  EXPECT_DOUBLE_EQ(d[0].joules, 25.0);
  EXPECT_TRUE(d[0].in_total);
  EXPECT_DOUBLE_EQ(d[1].joules, 0.0);  // core: unchanged
  EXPECT_FALSE(d[1].in_total);         // inside package-0
  EXPECT_DOUBLE_EQ(d[2].joules, 3.0);
  EXPECT_TRUE(d[2].in_total);  // DRAM is not inside the package
  EXPECT_DOUBLE_EQ(d[3].joules, (kRange - 1e6 - 3e6) * 1e-6);
  EXPECT_FALSE(d[5].in_total);  // psys would count the packages twice
  // package-1's counter wraps: from kRange - 1e6 to 4e6 is 5 J.
  set_energy(root, "intel-rapl:1", 4e6);
  d = meter.read();
  EXPECT_DOUBLE_EQ(d[3].joules, 5.0);
  EXPECT_DOUBLE_EQ(d[0].joules, 0.0);
}

TEST(EnergyMeter, NoPowercapDirectorySaysSo) {
  const std::string root = test::fresh_temp_dir("no-powercap") + "/absent";
  const EnergyMeter meter(root, false);
  EXPECT_FALSE(meter.available());
  EXPECT_TRUE(meter.domains().empty());
  EXPECT_NE(meter.describe().find("no " + root), std::string::npos) << meter.describe();
}

TEST(EnergyMeter, UnreadableCountersAreNamedNotReadAsZero) {
  const fs::path root = test::fresh_temp_dir("powercap-unreadable");
  zone(root, "intel-rapl:0", "package-0", 1e6);
  fs::remove(root / "intel-rapl:0" / "energy_uj");  // as a non-root user sees a 0400 file
  const EnergyMeter meter(root.string(), false);
  EXPECT_FALSE(meter.available());
  EXPECT_NE(meter.describe().find("not readable"), std::string::npos) << meter.describe();
}

TEST(EnergyMeter, TheTrainingMetricsCountJoulesPowerAndEnergyPerToken) {
  Registry r;
  train::TrainingMetrics m(r);
  m.record_energy({{"package-0", 30.0, true}, {"core-0", 20.0, false}, {"dram-0", 6.0, true}},
                  /*seconds=*/2.0, /*tokens=*/1200);
  m.record_energy({{"package-0", 10.0, true}, {"core-0", 5.0, false}, {"dram-0", 2.0, true}}, 1.0,
                  400);
  EXPECT_DOUBLE_EQ(r.get("moetron_energy_joules_total").value({"package-0"}), 40.0);
  EXPECT_DOUBLE_EQ(r.get("moetron_energy_joules_total").value({"core-0"}), 25.0);
  EXPECT_DOUBLE_EQ(r.get("moetron_power_watts").value({"package-0"}), 10.0);
  // The last step: (10 + 2) J over 400 tokens; core is inside the package.
  EXPECT_DOUBLE_EQ(r.get("moetron_energy_per_token_joules").value(), 12.0 / 400.0);
}

// On a GPU machine (scripts/gpu-check.sh runs it there): NVML is found
// through dlopen and an idle GPU's counter moves within a third of a second.
TEST(EnergyMeterCuda, NvmlCountsEachGpusEnergy) {
  MOETRON_SKIP_WITHOUT_GPU();
  EnergyMeter meter(test::fresh_temp_dir("gpu-energy") + "/no-powercap", /*use_nvml=*/true);
  ASSERT_TRUE(meter.available()) << meter.describe();
  const std::vector<std::string> domains = meter.domains();
  ASSERT_FALSE(domains.empty());
  EXPECT_EQ(domains[0], "gpu-0") << meter.describe();
  std::this_thread::sleep_for(std::chrono::milliseconds(350));
  const std::vector<EnergyDelta> d = meter.read();
  ASSERT_EQ(d.size(), domains.size());
  EXPECT_GT(d[0].joules, 0.0) << "an idle GPU draws tens of watts";
  EXPECT_LT(d[0].joules, 1000.0 * 0.35) << "more than 1 kW";
}

}  // namespace
}  // namespace moetron::monitor
