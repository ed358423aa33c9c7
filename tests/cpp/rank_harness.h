// Runs a function on forked ranks that rendezvous through a FileStore in a fresh directory.
#pragma once

#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gfdit/error.h"
#include "gfdit/store.h"
#include "gfdit/world.h"

namespace gfdit {
namespace testing {

// Inside a rank: a failed expectation throws, the harness reports it.
#define RANK_CHECK(cond)                                                    \
  do {                                                                      \
    if (!(cond)) {                                                          \
      std::ostringstream rank_check_os_;                                    \
      rank_check_os_ << __FILE__ << ":" << __LINE__ << ": expected " #cond; \
      throw std::runtime_error(rank_check_os_.str());                       \
    }                                                                       \
  } while (0)

#define RANK_CHECK_MSG(cond, msg)                                                       \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      std::ostringstream rank_check_os_;                                                \
      rank_check_os_ << __FILE__ << ":" << __LINE__ << ": expected " #cond ": " << msg; \
      throw std::runtime_error(rank_check_os_.str());                                   \
    }                                                                                   \
  } while (0)

inline std::set<std::string> shmNames() {
  std::set<std::string> names;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d)) {
      std::string n = e->d_name;
      if (n.rfind("gfdit-", 0) == 0) names.insert(n);
    }
    closedir(d);
  }
  return names;
}

// Returns "" when every rank returned normally, else what went wrong on each rank.
inline std::string runRanks(int n, const std::function<void(World&)>& fn, WorldOptions options = {},
                            int timeout_s = 120) {
  char tmpl[] = "/tmp/gfdit-test-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      int code = 0;
      try {
        FileStore store(dir, std::chrono::seconds(60));
        auto world = World::create(r, n, store, options);
        fn(*world);
      } catch (const std::exception& e) {
        std::ofstream(dir + "/error." + std::to_string(r)) << e.what();
        code = 1;
      }
      std::fflush(nullptr);
      _exit(code);
    }
    pids.push_back(pid);
  }
  std::ostringstream failures;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  std::vector<bool> done(n, false);
  int remaining = n;
  while (remaining > 0) {
    for (int r = 0; r < n; ++r) {
      if (done[r]) continue;
      int status = 0;
      if (waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        done[r] = true;
        --remaining;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
          std::ifstream err(dir + "/error." + std::to_string(r));
          std::stringstream ss;
          ss << err.rdbuf();
          failures << "rank " << r << " failed (status " << status << "): " << ss.str() << "\n";
        }
      }
    }
    if (remaining > 0 && std::chrono::steady_clock::now() > deadline) {
      for (int r = 0; r < n; ++r) {
        if (!done[r]) {
          kill(pids[r], SIGKILL);
          waitpid(pids[r], nullptr, 0);
          failures << "rank " << r << " hung past " << timeout_s << " s and was killed\n";
        }
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::string cmd = "rm -rf " + dir;
  if (std::system(cmd.c_str()) != 0) failures << "could not remove " << dir << "\n";
  return failures.str();
}

// Deterministic test data: a value for (instance, rank, index) that no two inputs share by accident.
inline uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

}  // namespace testing
}  // namespace gfdit
