#include "util/chromium_util.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "util/subprocess.h"

namespace moetron::test {

bool chromium_installed() {
  return ::access(kChromiumBinary, X_OK) == 0;
}

std::string load_in_chromium(const std::string& dir, const std::string& url, const std::string& png,
                             int virtual_ms) {
  const std::string out = dir + "/chromium.out", err = dir + "/chromium.err";
  std::filesystem::remove(out);
  std::filesystem::remove(png);
  Subprocess chromium(
      {kChromiumBinary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
       "--no-first-run", "--hide-scrollbars", "--user-data-dir=" + dir + "/chromium-profile",
       "--window-size=1400,2600", "--virtual-time-budget=" + std::to_string(virtual_ms),
       "--dump-dom", "--screenshot=" + png, url},
      out, err);
  const int code = chromium.wait(90);
  EXPECT_EQ(code, 0) << "chromium failed or timed out; its stderr (" << err << "):\n"
                     << read_text_file(err);
  return read_text_file(out);
}

std::string element_tag(const std::string& dom, const std::string& id) {
  const size_t at = dom.find("id=\"" + id + "\"");
  if (at == std::string::npos) return "";
  const size_t open = dom.rfind('<', at);
  return dom.substr(open, dom.find('>', at) - open + 1);
}

std::string element_text(const std::string& dom, const std::string& id) {
  const size_t at = dom.find("id=\"" + id + "\"");
  if (at == std::string::npos) return "";
  const size_t begin = dom.find('>', at) + 1;
  std::string text = dom.substr(begin, dom.find('<', begin) - begin);
  const size_t first = text.find_first_not_of(" \t\n");
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(" \t\n") - first + 1);
}

}  // namespace moetron::test
