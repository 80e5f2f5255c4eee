// tests/unit/config/hf_cache_test.cc: hub ids resolved from a fake Hugging Face cache laid out as
// huggingface_hub writes it (refs/<rev> holding a hash, snapshots/<hash>/ files symlinked to blobs/).
#include "config/hf_cache.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "config/generation_config.h"

namespace polylora {
namespace {
namespace fs = std::filesystem;

const std::string kMain = "0123456789abcdef0123456789abcdef01234567";
const std::string kOld = "fedcba9876543210fedcba9876543210fedcba98";

class HfCache : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("polylora-hf-" + std::to_string(getpid()) + "-" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    hub_ = root_ / "hub";
    fs::path repo = hub_ / "models--org--name";
    fs::create_directories(repo / "blobs");
    fs::create_directories(repo / "refs");
    for (const std::string& h : {kMain, kOld}) {
      fs::create_directories(repo / "snapshots" / h);
      std::ofstream(repo / "blobs" / ("blob-" + h)) << "{\"rev\": \"" << h << "\"}";
      fs::create_symlink(fs::path("../../blobs") / ("blob-" + h), repo / "snapshots" / h / "config.json");
    }
    std::ofstream(repo / "refs" / "main") << kMain;  // no newline, as huggingface_hub writes it
    std::ofstream(repo / "refs" / "v1") << kOld << "\n";
    saved_ = {env("HF_HUB_CACHE"), env("HF_HOME"), env("HUGGINGFACE_HUB_CACHE"), env("XDG_CACHE_HOME")};
    unsetenv("HUGGINGFACE_HUB_CACHE");
    unsetenv("XDG_CACHE_HOME");
  }
  void TearDown() override {
    fs::remove_all(root_);
    restore("HF_HUB_CACHE", saved_[0]);
    restore("HF_HOME", saved_[1]);
    restore("HUGGINGFACE_HUB_CACHE", saved_[2]);
    restore("XDG_CACHE_HOME", saved_[3]);
  }
  static std::optional<std::string> env(const char* n) {
    const char* v = std::getenv(n);
    return v ? std::optional<std::string>(v) : std::nullopt;
  }
  static void restore(const char* n, const std::optional<std::string>& v) {
    if (v)
      setenv(n, v->c_str(), 1);
    else
      unsetenv(n);
  }
  fs::path root_, hub_;
  std::vector<std::optional<std::string>> saved_;
};

TEST_F(HfCache, RefsAndHashes) {
  std::string snaps = (hub_ / "models--org--name" / "snapshots").string();
  EXPECT_EQ(find_hf_snapshot(hub_.string(), "org/name", "main"), snaps + "/" + kMain);
  EXPECT_EQ(find_hf_snapshot(hub_.string(), "org/name", ""), snaps + "/" + kMain);
  EXPECT_EQ(find_hf_snapshot(hub_.string(), "org/name", "v1"), snaps + "/" + kOld);
  EXPECT_EQ(find_hf_snapshot(hub_.string(), "org/name", kOld), snaps + "/" + kOld);
  EXPECT_EQ(find_hf_snapshot(hub_.string(), "org/name", "fedcba98"), snaps + "/" + kOld);  // a prefix
  EXPECT_EQ(find_hf_snapshot(hub_.string(), "org/name", "nosuchbranch"), std::nullopt);
  EXPECT_EQ(find_hf_snapshot(hub_.string(), "org/other", "main"), std::nullopt);
  // The snapshot's files are symlinks into blobs/, readable through the returned path.
  std::ifstream in(snaps + "/" + kMain + "/config.json");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find(kMain), std::string::npos);
}

TEST_F(HfCache, EnvironmentOrder) {
  setenv("HF_HUB_CACHE", hub_.c_str(), 1);
  setenv("HF_HOME", "/nonexistent", 1);
  EXPECT_EQ(hf_hub_cache_dir(), hub_.string());
  unsetenv("HF_HUB_CACHE");
  setenv("HF_HOME", root_.c_str(), 1);
  EXPECT_EQ(hf_hub_cache_dir(), (root_ / "hub").string());
  EXPECT_EQ(resolve_model_path("org/name", "main", "model"),
            (hub_ / "models--org--name" / "snapshots" / kMain).string());
  unsetenv("HF_HOME");
  const char* home = std::getenv("HOME");
  if (home) EXPECT_EQ(hf_hub_cache_dir(), std::string(home) + "/.cache/huggingface/hub");
}

TEST_F(HfCache, LocalDirectoriesWinAndErrorsSayWhere) {
  setenv("HF_HUB_CACHE", hub_.c_str(), 1);
  EXPECT_EQ(resolve_model_path(root_.string(), "main", "model"), root_.string());
  try {
    resolve_model_path("org/absent", "main", "model");
    FAIL();
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("model 'org/absent' is neither a local directory nor in the Hugging Face cache at " +
                     hub_.string() + "; polylora does not download"),
              std::string::npos)
        << m;
  }
  try {
    resolve_model_path("org/name", "v9", "adapter");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("revision 'v9'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(resolve_model_path("/no/such/dir", "main", "model"), Error);
  EXPECT_FALSE(looks_like_hub_id("/abs/path"));
  EXPECT_FALSE(looks_like_hub_id("./rel"));
  EXPECT_FALSE(looks_like_hub_id("a/b/c"));
  EXPECT_TRUE(looks_like_hub_id("Qwen/Qwen3-30B-A3B"));
  EXPECT_TRUE(looks_like_hub_id("gpt2"));
}

TEST(GenerationConfig, FileOverrideAndModes) {
  auto d = GenerationDefaults::from_json(
      R"({"temperature": 0.6, "top_p": 0.95, "top_k": 20, "eos_token_id": [1, 7], "max_new_tokens": 5,
          "do_sample": true, "transformers_version": "4"})",
      "g.json");
  EXPECT_EQ(d.temperature, 0.6);
  EXPECT_EQ(d.top_p, 0.95);
  EXPECT_EQ(d.top_k, 20);
  EXPECT_EQ(d.max_tokens, 5);
  EXPECT_EQ(d.eos_token_ids, (std::vector<int64_t>{1, 7}));
  EXPECT_FALSE(d.min_p);
  d.apply_override(R"({"temperature": 0.1, "max_tokens": 9, "repetition_penalty": 1.1})");
  EXPECT_EQ(d.temperature, 0.1);
  EXPECT_EQ(d.max_tokens, 9);
  EXPECT_EQ(d.repetition_penalty, 1.1);
  EXPECT_THROW(d.apply_override("{not json"), Error);
  EXPECT_THROW(d.apply_override(R"({"temperature": "hot"})"), Error);
  EXPECT_EQ(GenerationDefaults::from_json(R"({"eos_token_id": 3})", "g").eos_token_ids,
            std::vector<int64_t>{3});

  fs::path dir = fs::temp_directory_path() / ("polylora-gen-" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "generation_config.json") << R"({"temperature": 0.7, "eos_token_id": 4})";
  EXPECT_EQ(load_generation_defaults("auto", dir.string(), "").temperature, 0.7);
  // vllm: no sampling defaults from the file, but its EOS ids still stop generation (as vLLM).
  const GenerationDefaults v = load_generation_defaults("vllm", dir.string(), "");
  EXPECT_FALSE(v.temperature);
  EXPECT_EQ(v.eos_token_ids, std::vector<int64_t>{4});
  EXPECT_EQ(load_generation_defaults("vllm", dir.string(), R"({"top_k": 3})").top_k, 3);
  EXPECT_EQ(load_generation_defaults(dir.string(), "/nonexistent", "").eos_token_ids, std::vector<int64_t>{4});
  EXPECT_TRUE(load_generation_defaults("auto", "/nonexistent", "").empty());
  EXPECT_THROW(load_generation_defaults("/nonexistent", dir.string(), ""), Error);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace polylora
