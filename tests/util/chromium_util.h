// Debian's headless Chromium, run by a test on a page: its DOM after the
// page's scripts ran (virtual time, so polling pages need no real waiting)
// and a screenshot.
#pragma once

#include <string>

namespace moetron::test {

inline constexpr const char* kChromiumBinary = "/usr/bin/chromium";
bool chromium_installed();

// Loads `url` in a 1400x2600 window for `virtual_ms` of virtual time, writes
// its screenshot to `png` and returns the DOM. Chromium's profile and logs
// go under `dir`. A Chromium that fails or runs over 90 s fails the test.
std::string load_in_chromium(const std::string& dir, const std::string& url, const std::string& png,
                             int virtual_ms = 8000);

// The opening tag of the element with this id ("" when absent).
std::string element_tag(const std::string& dom, const std::string& id);
// The text directly inside the element with this id, trimmed ("" when absent).
std::string element_text(const std::string& dom, const std::string& id);

}  // namespace moetron::test
