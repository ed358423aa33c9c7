// The registry of settings (NOTE [settings] in src/core/settings.cpp): one entry per variable, every variable
// a reader names is in it, and the accessors parse as the readers did.
#include <dirent.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "gfdit/error.h"
#include "gfdit/settings.h"
#include "scoped_env.h"

namespace settings = gfdit::settings;

namespace {

using gfdit::testing::ScopedEnv;

// Files under `dir` (recursively) whose names end with one of `exts`.
void listFiles(const std::string& dir, const std::vector<std::string>& exts, std::vector<std::string>& out) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return;
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name == "." || name == ".." || name == "__pycache__") continue;
    std::string path = dir + "/" + name;
    if (e->d_type == DT_DIR) {
      listFiles(path, exts, out);
      continue;
    }
    for (const auto& ext : exts) {
      if (name.size() > ext.size() && name.compare(name.size() - ext.size(), ext.size(), ext) == 0) {
        out.push_back(path);
      }
    }
  }
  ::closedir(d);
}

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Every string literal "GFDIT_..." (a whole literal, a variable's name) in the files.
std::set<std::string> namedVariables(const std::vector<std::string>& files, const std::regex& literal) {
  std::set<std::string> names;
  for (const auto& f : files) {
    const std::string text = readFile(f);
    for (auto it = std::sregex_iterator(text.begin(), text.end(), literal); it != std::sregex_iterator(); ++it) {
      names.insert((*it)[1].str());
    }
  }
  return names;
}

}  // namespace

TEST(Settings, EveryEntryIsUniqueTypedAndExplained) {
  std::set<std::string> names;
  const std::set<std::string> types = {"bytes", "int", "seconds", "bool", "string"};
  ASSERT_FALSE(settings::all().empty());
  for (const settings::Setting& s : settings::all()) {
    EXPECT_TRUE(names.insert(s.name).second) << s.name << " is registered twice";
    EXPECT_EQ(std::string(s.name).rfind("GFDIT_", 0), 0u) << s.name;
    EXPECT_TRUE(types.count(s.type)) << s.name << ": type " << s.type;
    ASSERT_NE(s.default_value, nullptr) << s.name;
    EXPECT_GT(std::strlen(s.meaning), 20u) << s.name;
    EXPECT_EQ(settings::find(s.name), &s);
  }
  EXPECT_EQ(settings::find("GFDIT_NO_SUCH_SETTING"), nullptr);
  // the Python package's readers are registered too: one registry
  for (const char* py : {"GFDIT_HEAP_BYTES", "GFDIT_DEVICE", "GFDIT_NODE_IDS", "GFDIT_FAULT_INJECTION",
                         "GFDIT_WORKER_TRACEBACK", "GFDIT_ATTENTION_PLAN_CACHE"}) {
    EXPECT_NE(settings::find(py), nullptr) << py;
  }
}

TEST(Settings, EveryVariableTheSourcesNameIsRegisteredAndOnlyTheRegistryReadsTheEnvironment) {
  const std::string root = GFDIT_SOURCE_DIR;
  std::vector<std::string> cpp;
  listFiles(root + "/src", {".cpp", ".h", ".cu"}, cpp);
  listFiles(root + "/include", {".h"}, cpp);
  ASSERT_GT(cpp.size(), 20u) << "sources not found under " << root;
  const std::regex literal("\"(GFDIT_[A-Z0-9_]+)\"");
  std::set<std::string> named = namedVariables(cpp, literal);
  for (const char* expected : {"GFDIT_SLOT_BYTES", "GFDIT_SPIN_US", "GFDIT_PID_LIVENESS", "GFDIT_CUDA_SLOT_BYTES"}) {
    EXPECT_TRUE(named.count(expected)) << expected << " not seen: the scan is broken";
  }
  // the Python package's readers (read only: the Python side may name more, and must register them)
  std::vector<std::string> py;
  listFiles(root + "/python/gfdit", {".py"}, py);
  for (const auto& n : namedVariables(py, literal)) named.insert(n);
  for (const auto& n : named) EXPECT_NE(settings::find(n), nullptr) << n << " is read but not registered";
  // nobody but the registry asks the environment
  const std::regex getenv_call("\\bgetenv\\s*\\(");
  for (const auto& f : cpp) {
    if (f == root + "/src/core/settings.cpp") continue;
    const std::string text = readFile(f);
    EXPECT_FALSE(std::regex_search(text, getenv_call)) << f << " reads the environment itself";
  }
}

TEST(Settings, GetGivesTheValueOrTheDefaultAndRefusesUnknownNames) {
  {
    ScopedEnv e("GFDIT_HEAP_BYTES", nullptr);
    EXPECT_EQ(settings::get("GFDIT_HEAP_BYTES"), "268435456");  // the default world heap: 256 MiB
    EXPECT_EQ(settings::lookup("GFDIT_HEAP_BYTES"), nullptr);
  }
  {
    ScopedEnv e("GFDIT_HEAP_BYTES", "1024");
    EXPECT_EQ(settings::get("GFDIT_HEAP_BYTES"), "1024");
    EXPECT_STREQ(settings::lookup("GFDIT_HEAP_BYTES"), "1024");
  }
  {
    ScopedEnv e("GFDIT_DEVICE", nullptr);
    EXPECT_EQ(settings::get("GFDIT_DEVICE"), "");  // unset: the CPU
  }
  try {
    settings::get("GFDIT_NO_SUCH_SETTING");
    FAIL() << "an unknown name was accepted";
  } catch (const gfdit::Error& e) {
    EXPECT_EQ(e.code(), gfdit::ErrorCode::kInvalidUsage);
    EXPECT_NE(std::string(e.what()).find("GFDIT_NO_SUCH_SETTING"), std::string::npos) << e.what();
  }
  EXPECT_THROW(settings::lookup("GFDIT_NO_SUCH_SETTING"), gfdit::Error);
}

TEST(Settings, HostWorldAccessorsParseAsTheWorldDid) {
  {
    ScopedEnv a("GFDIT_SLOT_BYTES", nullptr), b("GFDIT_NUM_SLOTS", nullptr), c("GFDIT_SPIN_US", nullptr),
        d("GFDIT_YIELD_US", nullptr), t("GFDIT_COPY_TABLE", nullptr);
    EXPECT_EQ(settings::slotBytes(), 256u << 10);
    EXPECT_EQ(std::to_string(settings::slotBytes()), settings::get("GFDIT_SLOT_BYTES"));
    EXPECT_EQ(settings::numSlots(1), 8u);
    EXPECT_EQ(settings::numSlots(5), 16u);
    EXPECT_EQ(settings::numSlots(64), 128u);
    EXPECT_EQ(settings::spinUs(true), 1000);
    EXPECT_EQ(settings::spinUs(false), 2);
    EXPECT_EQ(settings::yieldUs(true), 0);
    EXPECT_EQ(settings::yieldUs(false), 300);
    EXPECT_FALSE(settings::waitsFixed());
    EXPECT_EQ(settings::copyTable(), nullptr);
  }
  {
    ScopedEnv a("GFDIT_SLOT_BYTES", ""), b("GFDIT_NUM_SLOTS", "");  // empty: the default
    EXPECT_EQ(settings::slotBytes(), 256u << 10);
    EXPECT_EQ(settings::numSlots(3), 8u);
  }
  for (const char* name : {"GFDIT_SPIN_US", "GFDIT_YIELD_US"}) {  // either one fixes the waits
    ScopedEnv c("GFDIT_SPIN_US", ""), d("GFDIT_YIELD_US", "");
    EXPECT_FALSE(settings::waitsFixed());
    ScopedEnv set(name, "0");
    EXPECT_TRUE(settings::waitsFixed()) << name;
  }
  {
    ScopedEnv a("GFDIT_SLOT_BYTES", "4096"), b("GFDIT_NUM_SLOTS", "3"), c("GFDIT_SPIN_US", "7"),
        d("GFDIT_YIELD_US", "9"), t("GFDIT_COPY_TABLE", "");
    EXPECT_EQ(settings::slotBytes(), 4096u);
    EXPECT_EQ(settings::numSlots(64), 3u);
    EXPECT_EQ(settings::spinUs(true), 7);
    EXPECT_EQ(settings::yieldUs(false), 9);
    EXPECT_TRUE(settings::waitsFixed());
    ASSERT_NE(settings::copyTable(), nullptr);  // an empty table is handed on as it is (the world refuses it)
    EXPECT_STREQ(settings::copyTable(), "");
  }
  {
    ScopedEnv a("GFDIT_SLOT_BYTES", "lots");
    EXPECT_THROW(settings::slotBytes(), std::invalid_argument);  // std::stoull, as before
  }
}

TEST(Settings, LivenessAccessorsParseAsLivenessDid) {
  {
    ScopedEnv a("GFDIT_PID_LIVENESS", nullptr), b("GFDIT_HEARTBEAT_STALE_S", nullptr);
    EXPECT_TRUE(settings::pidLiveness());
    EXPECT_DOUBLE_EQ(settings::heartbeatStaleS(), 10.0);
    EXPECT_EQ(settings::get("GFDIT_HEARTBEAT_STALE_S"), "10");
  }
  struct Case {
    const char* value;
    bool pid;
  };
  for (Case c : {Case{"", true}, Case{"1", true}, Case{"2", true}, Case{"0", false}, Case{"off", false}}) {
    ScopedEnv a("GFDIT_PID_LIVENESS", c.value);
    EXPECT_EQ(settings::pidLiveness(), c.pid) << "'" << c.value << "'";
  }
  struct Stale {
    const char* value;
    double s;
  };
  for (Stale c : {Stale{"", 10.0}, Stale{"2.5", 2.5}, Stale{"0", 10.0}, Stale{"-3", 10.0}, Stale{"soon", 10.0}}) {
    ScopedEnv a("GFDIT_HEARTBEAT_STALE_S", c.value);
    EXPECT_DOUBLE_EQ(settings::heartbeatStaleS(), c.s) << "'" << c.value << "'";
  }
}

TEST(Settings, CudaAccessorsParseAsTheCudaTransportDid) {
  {
    ScopedEnv a("GFDIT_CUDA_HEAP_BYTES", nullptr), b("GFDIT_CUDA_SLOT_BYTES", nullptr),
        c("GFDIT_CUDA_NUM_SLOTS", nullptr), d("GFDIT_CUDA_COPY_BLOCKS", nullptr), t("GFDIT_CUDA_COPY_TABLE", nullptr);
    EXPECT_EQ(settings::cudaHeapBytes(12345), 12345u);  // the host heap's size
    EXPECT_EQ(settings::cudaSlotBytes(), 4u << 20);
    EXPECT_EQ(std::to_string(settings::cudaSlotBytes()), settings::get("GFDIT_CUDA_SLOT_BYTES"));
    EXPECT_EQ(settings::cudaNumSlots(2), 8u);
    EXPECT_EQ(settings::cudaNumSlots(10), 36u);
    EXPECT_EQ(settings::cudaNumSlots(64), 64u);
    EXPECT_EQ(settings::cudaCopyBlocks(), 32);
    EXPECT_EQ(settings::cudaCopyBlocksToMeasure(), 32);
    EXPECT_EQ(settings::cudaCopyTable(), nullptr);
    EXPECT_EQ(settings::get("GFDIT_CUDA_COPY_TABLE"), settings::cudaDefaultCopyTable());
    EXPECT_STREQ(settings::cudaDefaultCopyTable(), "65536:sm,16777216:tma,inf:ce");
  }
  {
    ScopedEnv a("GFDIT_CUDA_HEAP_BYTES", "777"), b("GFDIT_CUDA_SLOT_BYTES", "65536"), c("GFDIT_CUDA_NUM_SLOTS", "5"),
        d("GFDIT_CUDA_COPY_BLOCKS", "4");
    EXPECT_EQ(settings::cudaHeapBytes(12345), 777u);
    EXPECT_EQ(settings::cudaSlotBytes(), 65536u);
    EXPECT_EQ(settings::cudaNumSlots(64), 5u);
    EXPECT_EQ(settings::cudaCopyBlocks(), 4);
    EXPECT_EQ(settings::cudaCopyBlocksToMeasure(), 4);
  }
  {
    ScopedEnv a("GFDIT_CUDA_SLOT_BYTES", "4M"), b("GFDIT_CUDA_COPY_BLOCKS", "many");
    try {
      settings::cudaSlotBytes();
      FAIL() << "4M was accepted";
    } catch (const gfdit::Error& e) {
      EXPECT_EQ(e.code(), gfdit::ErrorCode::kInvalidUsage);
      EXPECT_NE(std::string(e.what()).find("GFDIT_CUDA_SLOT_BYTES=4M is not a number"), std::string::npos) << e.what();
    }
    EXPECT_THROW(settings::cudaCopyBlocks(), gfdit::Error);
    EXPECT_EQ(settings::cudaCopyBlocksToMeasure(), 1);  // the measurement's std::atoi: at least one block
  }
}
