// Key-value store used once, at world setup, for the rendezvous of ranks.
#pragma once

#include <chrono>
#include <string>

namespace gfdit {

/// A rendezvous store: set a key, and get one, blocking until some rank has set it.
class Store {
 public:
  virtual ~Store() = default;
  /// Sets key to value (visible to every rank).
  virtual void set(const std::string& key, const std::string& value) = 0;
  /// Returns the value of key, waiting until it is set; throws Error(kTimeout) past the store's timeout.
  virtual std::string get(const std::string& key) = 0;
};

/// A store in a directory of one node's file system (tests and single-node C++ use).
class FileStore : public Store {
 public:
  /// Uses directory `path` (created if missing); get() waits at most `timeout`.
  explicit FileStore(std::string path, std::chrono::milliseconds timeout = std::chrono::seconds(60));
  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key) override;

 private:
  std::string path_;
  std::chrono::milliseconds timeout_;
};

}  // namespace gfdit
