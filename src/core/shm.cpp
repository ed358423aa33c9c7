#include "shm.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <sstream>
#include <utility>

#include "gfdit/error.h"

namespace gfdit {
namespace core {

std::string randomShmName(const std::string& prefix) {
  std::random_device rd;
  std::mt19937_64 gen((static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(::getpid()));
  std::ostringstream os;
  os << "/" << prefix << "-" << std::hex << gen() << gen();
  return os.str();
}

bool unlinkShm(const std::string& name) { return ::shm_unlink(name.c_str()) == 0; }

SharedMemory SharedMemory::map(int fd, const std::string& name, size_t bytes, bool owner) {
  void* p = bytes > 0 ? ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : nullptr;
  int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) {
    if (owner) ::shm_unlink(name.c_str());
    GFDIT_THROW(kSystemError) << "gfdit: mmap of " << bytes << " bytes of " << name << ": " << std::strerror(err);
  }
  SharedMemory m;
  m.data_ = static_cast<uint8_t*>(p);
  m.bytes_ = bytes;
  m.name_ = name;
  m.owns_name_ = owner;
  return m;
}

SharedMemory SharedMemory::createNamed(const std::string& name, size_t bytes) {
  int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) GFDIT_THROW(kSystemError) << "gfdit: shm_open(" << name << "): " << std::strerror(errno);
  if (bytes > 0 && ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    int err = errno;
    ::close(fd);
    ::shm_unlink(name.c_str());
    GFDIT_THROW(kSystemError) << "gfdit: ftruncate of " << name << " to " << bytes << " bytes: " << std::strerror(err);
  }
  return map(fd, name, bytes, true);  // fresh pages are zero
}

SharedMemory SharedMemory::createUnique(const std::string& prefix, size_t bytes) {
  for (int attempt = 0; attempt < 16; ++attempt) {
    std::string name = randomShmName(prefix);
    int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
      if (errno == EEXIST) continue;
      GFDIT_THROW(kSystemError) << "gfdit: shm_open: " << std::strerror(errno);
    }
    if (bytes > 0 && ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      int err = errno;
      ::close(fd);
      ::shm_unlink(name.c_str());
      GFDIT_THROW(kSystemError) << "gfdit: ftruncate to " << bytes << " bytes: " << std::strerror(err);
    }
    return map(fd, name, bytes, true);
  }
  GFDIT_THROW(kSystemError) << "gfdit: could not create a shared-memory object with prefix " << prefix;
}

SharedMemory SharedMemory::open(const std::string& name, size_t bytes) {
  int fd = ::shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) GFDIT_THROW(kSystemError) << "gfdit: shm_open(" << name << "): " << std::strerror(errno);
  return openFd(fd, name, bytes);
}

SharedMemory SharedMemory::openFd(int fd, const std::string& name, size_t bytes) {
  if (bytes == 0) {
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      int err = errno;
      ::close(fd);
      GFDIT_THROW(kSystemError) << "gfdit: fstat of " << name << ": " << std::strerror(err);
    }
    bytes = static_cast<size_t>(st.st_size);
  }
  return map(fd, name, bytes, false);
}

SharedMemory::SharedMemory(SharedMemory&& other) noexcept { *this = std::move(other); }

SharedMemory& SharedMemory::operator=(SharedMemory&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    name_ = std::move(other.name_);
    owns_name_ = std::exchange(other.owns_name_, false);
  }
  return *this;
}

SharedMemory::~SharedMemory() { reset(); }

void SharedMemory::reset() {
  if (data_ != nullptr) ::munmap(data_, bytes_);
  if (owns_name_) ::shm_unlink(name_.c_str());
  data_ = nullptr;
  bytes_ = 0;
  owns_name_ = false;
}

void SharedMemory::unlink() {
  if (owns_name_) {
    ::shm_unlink(name_.c_str());
    owns_name_ = false;
  }
}

}  // namespace core
}  // namespace gfdit
