// Outputs in shared memory (NOTE [outputs] in gfdit/outputs.h).
#include <dirent.h>

#include <cstring>

#include "gfdit/error.h"
#include "gfdit/outputs.h"
#include "shm.h"

namespace gfdit {
namespace runtime {

namespace {
// The first 16 characters of the queue set's random name: what tells one engine's names from another's.
std::string queueTag(const std::string& queue_name) {
  return queue_name.substr(queue_name.rfind('-') + 1).substr(0, 16);
}
}  // namespace

std::string outputPrefix(const std::string& queue_name) { return "/gfdit-o-" + queueTag(queue_name) + "-"; }

std::string worldShmPrefix(const std::string& queue_name) { return "gfdit-w-" + queueTag(queue_name); }

void writeOutput(const std::string& name, const void* data, size_t bytes, OutputRef& ref) {
  GFDIT_CHECK(!name.empty() && name[0] == '/' && name.size() < sizeof(ref.name)) << "output name '" << name << "'";
  auto out = core::SharedMemory::createNamed(name, bytes);
  if (bytes > 0) std::memcpy(out.data(), data, bytes);
  out.keepName();  // the engine maps it and removes the name (NOTE [outputs])
  std::memset(ref.name, 0, sizeof(ref.name));
  std::memcpy(ref.name, name.data(), name.size());
  ref.bytes = bytes;
}

MappedOutput::MappedOutput() = default;
MappedOutput::~MappedOutput() = default;
const void* MappedOutput::data() const { return shm_->data(); }
size_t MappedOutput::bytes() const { return shm_->size(); }

std::shared_ptr<MappedOutput> MappedOutput::open(const OutputRef& ref) {
  std::string name(ref.name, strnlen(ref.name, sizeof(ref.name)));
  std::shared_ptr<MappedOutput> out(new MappedOutput());
  out->shm_ = std::make_unique<core::SharedMemory>(core::SharedMemory::open(name, ref.bytes));
  core::unlinkShm(name);  // mapped: the name is no longer needed (NOTE [outputs])
  return out;
}

void discardOutput(const OutputRef& ref) {
  std::string name(ref.name, strnlen(ref.name, sizeof(ref.name)));
  if (!name.empty()) core::unlinkShm(name);
}

int unlinkOutputs(const std::string& prefix) {
  // POSIX shm names live in /dev/shm on Linux, without the leading '/'.
  std::string want = prefix.size() > 1 && prefix[0] == '/' ? prefix.substr(1) : prefix;
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return 0;
  int n = 0;
  while (dirent* e = ::readdir(dir)) {
    if (std::strncmp(e->d_name, want.c_str(), want.size()) == 0) {
      std::string name = "/" + std::string(e->d_name);
      if (core::unlinkShm(name)) ++n;
    }
  }
  ::closedir(dir);
  return n;
}

}  // namespace runtime
}  // namespace gfdit
