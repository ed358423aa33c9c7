// POSIX shared-memory objects: the regions of the collectives world, the runtime's rings and its outputs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace gfdit {
namespace core {

/// A unique name "/<prefix>-<32 hex digits>" for a shared-memory object.
std::string randomShmName(const std::string& prefix);
/// Removes a shared-memory object's name; false if there was none.
bool unlinkShm(const std::string& name);

/// A POSIX shared-memory object mapped read-write into this process. Unmapped when destroyed; the name is
/// removed then too unless unlink() ran earlier or the object was opened (not created) here.
class SharedMemory {
 public:
  SharedMemory() = default;
  /// Creates an object of `bytes` (zero-filled) under a fresh random name with `prefix`, mode 0600.
  static SharedMemory createUnique(const std::string& prefix, size_t bytes);
  /// Creates an object under exactly `name` (O_EXCL: fails if it exists), mode 0600.
  static SharedMemory createNamed(const std::string& name, size_t bytes);
  /// Maps an existing object; `bytes` 0 maps its whole size.
  static SharedMemory open(const std::string& name, size_t bytes = 0);
  /// Maps the object open at `fd` (taken: closed here), whose name may be gone already (a process that got the
  /// descriptor from the object's creator); `name` is for messages.
  static SharedMemory openFd(int fd, const std::string& name, size_t bytes = 0);

  SharedMemory(SharedMemory&& other) noexcept;
  SharedMemory& operator=(SharedMemory&& other) noexcept;
  SharedMemory(const SharedMemory&) = delete;
  SharedMemory& operator=(const SharedMemory&) = delete;
  ~SharedMemory();

  /// Removes the name (the mapping stays valid): nothing is left in /dev/shm once every process that needs
  /// it mapped it, even if a process is killed later.
  void unlink();
  /// Leaves the name in place when this object is destroyed (another process opens and unlinks it).
  void keepName() { owns_name_ = false; }
  uint8_t* data() const { return data_; }
  size_t size() const { return bytes_; }
  const std::string& name() const { return name_; }
  bool valid() const { return data_ != nullptr; }

 private:
  static SharedMemory map(int fd, const std::string& name, size_t bytes, bool owner);
  void reset();

  uint8_t* data_ = nullptr;
  size_t bytes_ = 0;
  std::string name_;
  bool owns_name_ = false;  // created here and not unlinked yet
};

}  // namespace core
}  // namespace gfdit
