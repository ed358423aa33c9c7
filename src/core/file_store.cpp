// FileStore: keys are files in a directory; a value appears atomically through rename().
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "gfdit/error.h"
#include "gfdit/store.h"

namespace gfdit {
namespace {

std::string encodeKey(const std::string& key) {
  // Keys hold '/'; file names may not.
  std::string out;
  for (char c : key) out += (c == '/') ? '%' : c;
  return out;
}

}  // namespace

FileStore::FileStore(std::string path, std::chrono::milliseconds timeout) : path_(std::move(path)), timeout_(timeout) {
  if (::mkdir(path_.c_str(), 0700) != 0 && errno != EEXIST) {
    GFDIT_THROW(kSystemError) << "FileStore: mkdir " << path_ << ": " << std::strerror(errno);
  }
}

void FileStore::set(const std::string& key, const std::string& value) {
  std::random_device rd;
  std::string final_path = path_ + "/" + encodeKey(key);
  std::string tmp_path = final_path + ".tmp" + std::to_string(::getpid()) + "_" + std::to_string(rd());
  {
    std::ofstream out(tmp_path, std::ios::binary);
    GFDIT_CHECK_CODE(kSystemError, out.good()) << "FileStore: cannot write " << tmp_path;
    out.write(value.data(), static_cast<std::streamsize>(value.size()));
  }
  if (::rename(tmp_path.c_str(), final_path.c_str()) != 0) {
    GFDIT_THROW(kSystemError) << "FileStore: rename to " << final_path << ": " << std::strerror(errno);
  }
}

std::string FileStore::get(const std::string& key) {
  std::string file = path_ + "/" + encodeKey(key);
  auto deadline = std::chrono::steady_clock::now() + timeout_;
  auto pause = std::chrono::microseconds(50);
  while (true) {
    std::ifstream in(file, std::ios::binary);
    if (in.good()) {
      std::stringstream ss;
      ss << in.rdbuf();
      return ss.str();
    }
    if (std::chrono::steady_clock::now() > deadline) {
      GFDIT_THROW(kTimeout) << "FileStore: key '" << key << "' not set within " << timeout_.count() << " ms";
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(20000));
  }
}

}  // namespace gfdit
