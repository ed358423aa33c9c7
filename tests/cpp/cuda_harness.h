// Runs CUDA transport tests on forked ranks. A CUDA context does not survive fork, so this process never
// touches CUDA: whether a device exists is asked in a child, and every rank creates its context after the
// fork (inside makeCudaTransport).
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cuda/cuda_transport.h"
#include "gfdit/store.h"
#include "rank_harness.h"

namespace gfdit {
namespace testing {

// The number of CUDA devices, asked once in a child process; `why` says why there are none.
inline int cudaDevicesInChild(std::string* why = nullptr) {
  static int cached = -1;
  static std::string reason;
  if (cached < 0) {
    int fds[2];
    if (pipe(fds) != 0) return 0;
    pid_t pid = fork();
    if (pid == 0) {
      close(fds[0]);
      int n = cuda::deviceCount();
      std::string status = n > 0 ? "" : cuda::deviceStatus();
      if (!status.empty() && write(fds[1], status.data(), status.size()) < 0) n = 0;
      _exit(n > 100 ? 100 : n);
    }
    close(fds[1]);
    char buf[512];
    ssize_t got;
    while ((got = read(fds[0], buf, sizeof(buf))) > 0) reason.append(buf, static_cast<size_t>(got));
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    cached = WIFEXITED(status) ? WEXITSTATUS(status) : 0;
  }
  if (why != nullptr) *why = reason;
  return cached;
}

// Skips a test without a device, saying why (a driver too old for this runtime reads differently from none).
#define GFDIT_REQUIRE_CUDA_DEVICE()                               \
  do {                                                            \
    std::string gfdit_why_;                                       \
    if (::gfdit::testing::cudaDevicesInChild(&gfdit_why_) == 0) { \
      GTEST_SKIP() << "no CUDA device (" << gfdit_why_ << ")";    \
    }                                                             \
  } while (0)

// Every rank sets `name/rank`, then waits for every other rank's.
inline void storeBarrier(Store& store, const std::string& name, int rank, int n) {
  store.set(name + "/" + std::to_string(rank), "1");
  for (int p = 0; p < n; ++p) {
    if (p != rank) store.get(name + "/" + std::to_string(p));
  }
}

using CudaRankFn = std::function<void(int rank, CudaTransport& t, Store& store)>;

// Runs fn on n forked ranks, each with a CUDA transport on device rank % devices; ranks meet at a store
// barrier after fn (so nobody frees a region a peer still reads). "" when every rank returned normally.
inline std::string runCudaRanks(int n, const CudaRankFn& fn, CudaTransportOptions options = {}, int timeout_s = 240) {
  char tmpl[] = "/tmp/gfdit-cuda-test-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      int code = 0;
      try {
        FileStore store(dir, std::chrono::seconds(120));
        int devices = cuda::deviceCount();
        auto t = makeCudaTransport(r, n, devices > 0 ? r % devices : 0, store, "test", options);
        fn(r, *t, store);
        storeBarrier(store, "test/done", r, n);
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
  std::vector<bool> done(static_cast<size_t>(n), false);
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

// Runs fn in one forked child (a single-process device test); "" when it returned normally.
inline std::string runInChild(const std::function<void()>& fn, int timeout_s = 240) {
  return runRanks(1, [&](World&) { fn(); }, WorldOptions{}, timeout_s);
}

}  // namespace testing
}  // namespace gfdit
