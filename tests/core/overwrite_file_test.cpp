// Writing a file in place: the same inode (tmpfs keeps its pages), cut to
// what was written, and a file linked under another name replaced rather
// than changed under that name.
#include "moetron/core/overwrite_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "moetron/core/error.h"
#include "moetron/core/manifest.h"

namespace moetron {
namespace {

namespace fs = std::filesystem;

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

ino_t inode(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_ino;
}

// Also checks the checksum taken while writing is what reading the file gives.
void write_all(const std::string& path, const std::string& text) {
  OverwriteFile f(path);
  f.write(text.data(), text.size() / 2);
  f.write(text.data() + text.size() / 2, text.size() - text.size() / 2);
  EXPECT_EQ(f.written(), static_cast<int64_t>(text.size()));
  f.finish();
  EXPECT_EQ(f.checksum(), file_checksum(path)) << path;
}

std::string scratch(const std::string& name) {
  const fs::path dir =
      fs::temp_directory_path() / ("moetron_overwrite_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return (dir / name).string();
}

TEST(OverwriteFile, RewritesInPlaceAndCutsToWhatWasWritten) {
  const std::string path = scratch("a");
  write_all(path, "a longer first version");
  const ino_t first = inode(path);
  write_all(path, "short");
  EXPECT_EQ(slurp(path), "short");
  EXPECT_EQ(inode(path), first);  // the same file: its pages were reused
  write_all(path, "");
  EXPECT_EQ(fs::file_size(path), 0u);
  fs::remove_all(fs::path(path).parent_path());
}

TEST(OverwriteFile, AFileLinkedElsewhereIsReplacedNotChanged) {
  const std::string path = scratch("b"), other = scratch("b-link");
  write_all(path, "kept under the other name");
  fs::create_hard_link(path, other);
  write_all(path, "new");
  EXPECT_EQ(slurp(path), "new");
  EXPECT_EQ(slurp(other), "kept under the other name");
  EXPECT_NE(inode(path), inode(other));
  fs::remove_all(fs::path(path).parent_path());
}

TEST(OverwriteFile, AnUnwritableDirectoryNamesThePath) {
  try {
    OverwriteFile f("/nonexistent-dir-for-moetron/x");
    FAIL() << "opened a file in a directory that does not exist";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-dir-for-moetron/x"), std::string::npos);
  }
}

}  // namespace
}  // namespace moetron
