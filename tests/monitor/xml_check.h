// Well-formedness checks for the report's SVG: a small tag-balance checker
// (elements nested and closed, attributes quoted, entities known) and, where
// python3 exists, its xml.etree parser.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace moetron::monitor {

// "" when well-formed, else what is wrong and where.
inline std::string check_xml(const std::string& s) {
  std::vector<std::string> open;
  size_t i = 0;
  while (i < s.size()) {
    if (s[i] == '&') {
      const size_t semi = s.find(';', i);
      const std::string ent = semi == std::string::npos ? "" : s.substr(i, semi - i + 1);
      if (ent != "&amp;" && ent != "&lt;" && ent != "&gt;" && ent != "&quot;" && ent != "&#39;")
        return "bad entity at " + std::to_string(i);
      i = semi + 1;
      continue;
    }
    if (s[i] != '<') {
      ++i;
      continue;
    }
    if (s.compare(i, 2, "<?") == 0 || s.compare(i, 4, "<!--") == 0 || s.compare(i, 2, "<!") == 0) {
      i = s.find('>', i);
      if (i == std::string::npos) return "unterminated declaration";
      ++i;
      continue;
    }
    size_t j = i + 1;
    bool quoted = false;
    while (j < s.size() && (quoted || s[j] != '>')) {
      if (s[j] == '"') quoted = !quoted;
      if (!quoted && s[j] == '<') return "'<' inside a tag at " + std::to_string(j);
      ++j;
    }
    if (j >= s.size()) return "unterminated tag at " + std::to_string(i);
    const std::string tag = s.substr(i + 1, j - i - 1);
    const std::string name =
        tag.substr(tag[0] == '/', tag.find_first_of(" \t\n/", 1) - (tag[0] == '/'));
    if (tag[0] == '/') {
      if (open.empty() || open.back() != name)
        return "</" + name + "> does not close <" + (open.empty() ? "" : open.back()) + ">";
      open.pop_back();
    } else if (tag.back() != '/') {
      open.push_back(name);
    }
    i = j + 1;
  }
  return open.empty() ? "" : "<" + open.back() + "> not closed";
}

// Debian's python3 (scripts/install-deps.sh installs it), else the PATH's;
// "" when there is none.
inline const std::string& python3() {
  static const std::string py = [] {
    for (const char* p : {"/usr/bin/python3", "python3"}) {
      const std::string cmd =
          std::string(p) + " -c 'import xml.etree.ElementTree' > /dev/null 2>&1";
      if (std::system(cmd.c_str()) == 0) return std::string(p);
    }
    return std::string();
  }();
  return py;
}

// True when python3's xml.etree parses every document (one python3 run for
// all of them), or python3 is absent.
inline bool python_parses_xml(const std::vector<std::string>& docs) {
  if (python3().empty()) return true;
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("moetron_xml_" + std::to_string(::getpid())))
          .string();
  std::filesystem::create_directories(dir);
  std::string args;
  for (size_t i = 0; i < docs.size(); ++i) {
    const std::string path = dir + "/" + std::to_string(i) + ".svg";
    std::ofstream(path) << docs[i];
    args += " " + path;
  }
  const int rc = std::system((python3() +
                              " -c 'import sys, xml.etree.ElementTree as E; [E.parse(f) for f in "
                              "sys.argv[1:]]'" +
                              args)
                                 .c_str());
  std::filesystem::remove_all(dir);
  return rc == 0;
}

}  // namespace moetron::monitor
