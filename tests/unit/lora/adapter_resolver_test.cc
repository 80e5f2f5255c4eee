// tests/unit/lora/adapter_resolver_test.cc: loading on first use (--lora-resolver-dir, vLLM's filesystem
// resolver; issue 17 item 3) through the public Engine and EngineThread APIs on qwen3-moe-tiny with its
// per-expert-r8 fixture adapter: a name found in DIR loads once and then generates exactly what the same
// adapter registered at start generates; path syntax ('..', '/', '.', control characters) and names not
// in DIR are unknown models; symbolic links (out of DIR or inside it, as the directory or as a file) are
// refused with a message naming --lora-resolver-dir, with openat2 and with the O_NOFOLLOW walk; a
// corrupt adapter fails only the requests that named it (and is tried again later) while others
// generate; concurrent first requests for one name share one load.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include "common/error.h"
#include "engine/engine_thread.h"
#include "lora/adapter_files.h"
#include "lora/adapter_resolver.h"
#include "model/model.h"
#include "unit/engine_run.h"
#include "unit/test_util.h"

namespace polylora {
namespace {

namespace fs = std::filesystem;
using namespace testing_util;

fs::path fixture_adapter() {
  return fs::path(data_dir()) / "models/qwen3-moe-tiny/adapters/per-expert-r8";
}

class AdapterResolverTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = Model::load((fs::path(data_dir()) / "models/qwen3-moe-tiny").string());
  }
  static void TearDownTestSuite() { model_.reset(); }
  void SetUp() override {
    tmp_ = make_temp_dir("resolver");
    dir_ = tmp_ / "resolver";
    outside_ = tmp_ / "outside";
    fs::create_directories(dir_);
    fs::create_directories(outside_);
    fs::copy(fixture_adapter(), dir_ / "good");
    fs::copy(fixture_adapter(), dir_ / "good2");
    fs::copy(fixture_adapter(), outside_ / "adapter");
  }
  void TearDown() override {
    set_openat2_disabled_for_testing(false);
    fs::remove_all(tmp_);
  }
  EngineConfig config(bool resolver = true, bool load_thread = true) const {
    EngineConfig ec = test_engine_config();
    if (resolver) ec.lora.resolver_dir = dir_.string();
    ec.lora.load_thread = load_thread;
    return ec;
  }
  // Polls until the engine reports `n` resolutions (the loader thread runs meanwhile).
  static std::vector<Engine::AdapterResolution> wait_resolutions(Engine& engine, size_t n) {
    std::vector<Engine::AdapterResolution> out;
    for (int i = 0; i < 2000 && out.size() < n; ++i) {
      engine.poll_adapter_loads();
      for (auto& r : engine.take_resolutions()) out.push_back(std::move(r));
      if (out.size() < n) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return out;
  }
  static std::vector<int32_t> prompt(int k) {
    std::vector<int32_t> p;
    for (int i = 0; i < 6 + k; ++i) p.push_back(static_cast<int32_t>(11 + 37 * i + 5 * k));
    return p;
  }

  static inline std::shared_ptr<Model> model_;
  fs::path tmp_, dir_, outside_;
};

TEST_F(AdapterResolverTest, LoadsOnFirstUseAndGeneratesAsTheSameAdapterRegisteredAtStart) {
  Engine engine(model_, config(), nullptr);
  ASSERT_FALSE(engine.has_adapter("good"));
  EXPECT_EQ(engine.lookup_adapter("good"), Engine::AdapterLookup::kLoading);
  EXPECT_EQ(engine.lookup_adapter("good"), Engine::AdapterLookup::kLoading);  // no second load
  EXPECT_TRUE(engine.adapters().empty()) << "not listed while it loads";
  std::vector<Engine::AdapterResolution> res = wait_resolutions(engine, 1);
  ASSERT_EQ(res.size(), 1u);
  EXPECT_EQ(res[0].name, "good");
  EXPECT_FALSE(res[0].error.has_value()) << *res[0].error;
  EXPECT_EQ(engine.lookup_adapter("good"), Engine::AdapterLookup::kRegistered);
  ASSERT_EQ(engine.adapters().size(), 1u);
  EXPECT_EQ(engine.adapters()[0].path, (dir_ / "good").string());
  // In host memory; the engine may already have copied it into an empty device slot.
  EXPECT_NE(engine.adapters()[0].tier, AdapterTier::kDisk);
  EXPECT_EQ(engine.check_invariants(), "");
  std::vector<EngineRequest> reqs;
  for (int k = 0; k < 3; ++k) reqs.push_back(greedy_request(prompt(k), 6, "good"));
  reqs.push_back(greedy_request(prompt(0), 6));
  std::vector<EngineRun> runs = run_to_completion(engine, reqs);
  EXPECT_EQ(engine.adapter_registry().stats().loads_host, 1);
  EXPECT_EQ(engine.check_invariants(), "");

  // The same adapter registered at start, on a server without a resolver.
  Engine reference(model_, config(false), nullptr);
  reference.add_adapter(load_peft_adapter(fixture_adapter().string(), "good", model_->config(), {}));
  std::vector<EngineRun> want = run_to_completion(reference, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(runs[i].output, want[i].output) << "request " << i;
  EXPECT_NE(runs[0].output, runs[3].output) << "the adapter should change the output of the same prompt";
}

TEST_F(AdapterResolverTest, PathSyntaxAndMissingNamesAreUnknownModels) {
  Engine engine(model_, config(), nullptr);
  const std::vector<std::string> names = {"",
                                          ".",
                                          "..",
                                          "../good",
                                          "good/..",
                                          "./good",
                                          "a/b",
                                          "/good",
                                          "go\\od",
                                          "go\nod",
                                          "go\x7f"
                                          "od",
                                          std::string(256, 'g'),
                                          "missing",
                                          std::string("go\0od", 5)};
  for (const std::string& name : names) {
    EXPECT_EQ(engine.lookup_adapter(name), Engine::AdapterLookup::kUnknown) << "name '" << name << "'";
    EngineRequest r = greedy_request(prompt(0), 2, name.empty() ? "x/" : name);
    r.request_id = "p" + std::to_string(r.prompt_ids.size() + name.size());
    try {
      engine.add_request(std::move(r));
      ADD_FAILURE() << "name '" << name << "' was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kNotFound) << e.what();
      EXPECT_EQ(std::string(e.what()).rfind("The model `", 0), 0u) << e.what();
    }
  }
  EXPECT_TRUE(engine.adapters().empty());
  EXPECT_FALSE(engine.resolving());
  EXPECT_TRUE(AdapterResolver::plain_name("good"));
  EXPECT_TRUE(AdapterResolver::plain_name("org.adapter-v2_ä"));
  EXPECT_TRUE(AdapterResolver::plain_name(std::string(255, 'g')));
  // Without a resolver nothing is looked up, even a name that is there.
  Engine plain(model_, config(false), nullptr);
  EXPECT_FALSE(plain.has_resolver());
  EXPECT_EQ(plain.lookup_adapter("good"), Engine::AdapterLookup::kUnknown);
  // A resolver directory that does not exist is refused at start.
  EngineConfig bad = config();
  bad.lora.resolver_dir = (tmp_ / "nope").string();
  EXPECT_THROW(Engine(model_, bad, nullptr), Error);
}

TEST_F(AdapterResolverTest, SymbolicLinksAreRefusedNamingTheResolverDir) {
  fs::create_directory_symlink(outside_ / "adapter", dir_ / "link-out");  // escapes DIR
  fs::create_directory_symlink(dir_ / "good", dir_ / "link-in");          // stays inside, still a link
  fs::create_directories(dir_ / "file-link");
  fs::copy_file(fixture_adapter() / "adapter_config.json", dir_ / "file-link/adapter_config.json");
  fs::create_symlink(outside_ / "adapter/adapter_model.safetensors",
                     dir_ / "file-link/adapter_model.safetensors");
  for (bool walk : {false, true}) {
    set_openat2_disabled_for_testing(walk);
    Engine engine(model_, config(), nullptr);
    for (const char* name : {"link-out", "link-in", "file-link"}) {
      ASSERT_EQ(engine.lookup_adapter(name), Engine::AdapterLookup::kLoading) << name;
      std::vector<Engine::AdapterResolution> res = wait_resolutions(engine, 1);
      ASSERT_EQ(res.size(), 1u) << name;
      ASSERT_TRUE(res[0].error.has_value()) << name << " was loaded through a symbolic link";
      EXPECT_NE(res[0].error->find("symbolic link"), std::string::npos) << *res[0].error;
      EXPECT_NE(res[0].error->find("--lora-resolver-dir"), std::string::npos) << *res[0].error;
      EXPECT_EQ(res[0].error->find("--lora-allowed-dirs"), std::string::npos) << *res[0].error;
      EXPECT_FALSE(engine.has_adapter(name)) << "a refused adapter stays unregistered";
    }
    EXPECT_EQ(engine.adapter_registry().stats().load_failures, 3);
    EXPECT_EQ(engine.check_invariants(), "");
  }
}

// Reads every output of a stream; returns the tokens and the error, if any.
std::pair<std::vector<int32_t>, std::optional<std::string>> drain(
    const std::shared_ptr<OutputStream>& stream) {
  std::vector<int32_t> tokens;
  std::optional<std::string> error;
  for (int i = 0; i < 6000 && !stream->done(); ++i)
    if (auto out = stream->next(std::chrono::milliseconds(10))) {
      for (const auto& so : out->sequences)
        tokens.insert(tokens.end(), so.new_token_ids.begin(), so.new_token_ids.end());
      if (out->error) error = out->error;
    }
  return {tokens, error};
}

TEST_F(AdapterResolverTest, CorruptAdapterFailsOnlyItsOwnRequests) {
  fs::copy(fixture_adapter(), dir_ / "bad");
  { std::ofstream(dir_ / "bad/adapter_config.json") << "{\"r\": 8, \"lora_alpha\": "; }
  fs::copy(fixture_adapter(), dir_ / "truncated");
  fs::resize_file(dir_ / "truncated/adapter_model.safetensors", 100);
  EngineThreadOptions opts;
  opts.log_stats_interval = 0;
  EngineThread et(std::make_unique<Engine>(model_, config(), nullptr), opts);
  ASSERT_TRUE(et.resolves_adapters());
  // A base-model request and one for a good adapter run while the broken ones fail.
  std::vector<std::shared_ptr<OutputStream>> ok;
  std::vector<std::pair<std::string, std::exception_ptr>> refused;
  std::mutex mu;
  std::atomic<int> answered{0};
  auto submit = [&](const std::string& id, const std::string& adapter, int64_t max_tokens) {
    EngineRequest r = greedy_request(prompt(1), max_tokens, adapter);
    r.request_id = id;
    et.add_request_async(std::move(r), [&, id](std::shared_ptr<OutputStream> s, std::exception_ptr e) {
      std::lock_guard<std::mutex> lock(mu);
      if (e)
        refused.emplace_back(id, e);
      else
        ok.push_back(std::move(s));
      ++answered;
    });
  };
  submit("base", "", 24);
  submit("bad", "bad", 4);
  submit("good", "good", 8);
  submit("truncated", "truncated", 4);
  for (int i = 0; i < 3000 && answered < 4; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(answered.load(), 4);
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(refused.size(), 2u);
  for (const auto& [id, e] : refused) {
    try {
      std::rethrow_exception(e);
    } catch (const Error& err) {
      std::string m = err.what();
      EXPECT_EQ(err.kind(), ErrorKind::kInvalid) << m;
      EXPECT_NE(m.find("LoRA adapter '" + id + "' was found but could not be loaded"), std::string::npos)
          << m;
      EXPECT_NE(m.find(id == "bad" ? "adapter_config.json" : "adapter_model.safetensors"), std::string::npos)
          << m;
    }
  }
  ASSERT_EQ(ok.size(), 2u);
  for (auto& s : ok) {
    auto [tokens, error] = drain(s);
    EXPECT_FALSE(error.has_value()) << *error;
    EXPECT_TRUE(tokens.size() == 24 || tokens.size() == 8) << tokens.size();
  }
  // Tried again on the next request (the files may have been fixed), refused again.
  EngineRequest again = greedy_request(prompt(0), 2, "bad");
  again.request_id = "bad-again";
  EXPECT_THROW(et.add_request(std::move(again)), Error);
  EngineSnapshot snap = et.snapshot();
  ASSERT_EQ(snap.adapters.size(), 1u);
  EXPECT_EQ(snap.adapters[0].name, "good");
  EXPECT_EQ(snap.stats.adapter_tiers.load_failures, 3);
  EXPECT_FALSE(et.has_adapter("bad"));
  et.shutdown(std::chrono::milliseconds(0));
}

TEST_F(AdapterResolverTest, ConcurrentFirstRequestsShareOneLoad) {
  EngineThreadOptions opts;
  opts.log_stats_interval = 0;
  EngineThread et(std::make_unique<Engine>(model_, config(), nullptr), opts);
  constexpr int kThreads = 8;
  std::vector<std::vector<int32_t>> outputs(kThreads);
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      try {
        EngineRequest r = greedy_request(prompt(2), 5, "good2");
        r.request_id = "c" + std::to_string(t);
        auto [tokens, error] = drain(et.add_request(std::move(r)));
        outputs[t] = tokens;
        if (error) errors[t] = *error;
      } catch (const std::exception& e) {
        errors[t] = e.what();
      }
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(errors[t], "") << "thread " << t;
    EXPECT_EQ(outputs[t].size(), 5u);
    EXPECT_EQ(outputs[t], outputs[0]) << "greedy requests of one adapter and prompt agree";
  }
  EngineSnapshot snap = et.snapshot();
  EXPECT_EQ(snap.stats.adapter_tiers.loads_host, 1) << "one load for eight first requests";
  EXPECT_EQ(snap.stats.adapter_tiers.latency_count, 1);
  ASSERT_EQ(snap.adapters.size(), 1u);
  EXPECT_EQ(snap.adapters[0].name, "good2");
  et.shutdown(std::chrono::milliseconds(0));
}

// Loads inline (no loader thread, as deterministic tests run them): the same first-use path.
TEST_F(AdapterResolverTest, InlineLoadsResolveOnThePoll) {
  Engine engine(model_, config(true, false), nullptr);
  ASSERT_EQ(engine.lookup_adapter("good"), Engine::AdapterLookup::kLoading);
  std::vector<Engine::AdapterResolution> res = wait_resolutions(engine, 1);
  ASSERT_EQ(res.size(), 1u);
  EXPECT_FALSE(res[0].error.has_value());
  EngineRun run = run_one(engine, greedy_request(prompt(0), 3, "good"));
  EXPECT_EQ(run.output.size(), 3u);
  EXPECT_EQ(engine.check_invariants(), "");
}

}  // namespace
}  // namespace polylora
