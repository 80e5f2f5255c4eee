// tests/unit/lora/adapter_tiers_test.cc: thousands of adapters over three tiers (issue 17). 1,000 small
// adapters generated into a temp dir for qwen3-moe-tiny (ranks 1-8, every third on the experts too),
// Zipf traffic with --max-loras 4 --max-cpu-loras 32: every output equals the same request's output on a
// configuration where everything fits; loads and evictions happen and are counted; registry invariants
// (pins, slots used by a step in flight, host tier within its limit) hold after every step, and pins
// return to zero. Also the slot manager on its own.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <tuple>
#include <chrono>

#include "common/error.h"
#include "lora/adapter_registry.h"
#include "lora/adapter_slots.h"
#include "model/model.h"
#include "unit/engine_run.h"
#include "unit/test_util.h"

namespace polylora {
namespace {

namespace fs = std::filesystem;
using namespace testing_util;

RawTensor random_tensor(std::vector<int64_t> shape, std::mt19937& rng, float scale) {
  RawTensor t = f32_tensor(shape, 0);
  std::uniform_real_distribution<float> u(-scale, scale);
  for (size_t i = 0; i < t.bytes.size(); i += 4) {
    float v = u(rng);
    std::memcpy(t.bytes.data() + i, &v, 4);
  }
  return t;
}

// qwen3-moe-tiny: hidden 128, q 4x32, kv 2x32, 8 experts of intermediate 64, 3 layers.
void write_adapter(const fs::path& dir, int index) {
  std::mt19937 rng(static_cast<uint32_t>(1000 + index));
  const int64_t r = int64_t{1} << (index % 4);  // 1, 2, 4, 8
  const bool experts = index % 3 == 0;
  std::map<std::string, RawTensor> t;
  for (int l = 0; l < 3; ++l) {
    std::string pre = "base_model.model.model.layers." + std::to_string(l) + ".";
    t[pre + "self_attn.q_proj.lora_A.weight"] = random_tensor({r, 128}, rng, 0.3f);
    t[pre + "self_attn.q_proj.lora_B.weight"] = random_tensor({128, r}, rng, 0.3f);
    t[pre + "self_attn.v_proj.lora_A.weight"] = random_tensor({r, 128}, rng, 0.3f);
    t[pre + "self_attn.v_proj.lora_B.weight"] = random_tensor({64, r}, rng, 0.3f);
    if (experts && l == 1)
      for (int e = 0; e < 8; ++e) {
        std::string ep = pre + "mlp.experts." + std::to_string(e) + ".";
        t[ep + "gate_proj.lora_A.weight"] = random_tensor({r, 128}, rng, 0.3f);
        t[ep + "gate_proj.lora_B.weight"] = random_tensor({64, r}, rng, 0.3f);
        t[ep + "up_proj.lora_A.weight"] = random_tensor({r, 128}, rng, 0.3f);
        t[ep + "up_proj.lora_B.weight"] = random_tensor({64, r}, rng, 0.3f);
        t[ep + "down_proj.lora_A.weight"] = random_tensor({r, 64}, rng, 0.3f);
        t[ep + "down_proj.lora_B.weight"] = random_tensor({128, r}, rng, 0.3f);
      }
  }
  nlohmann::json targets = experts ? nlohmann::json{"q_proj", "v_proj", "gate_proj", "up_proj", "down_proj"}
                                   : nlohmann::json{"q_proj", "v_proj"};
  fs::create_directories(dir);
  write_json(dir / "adapter_config.json", {{"peft_type", "LORA"},
                                           {"r", r},
                                           {"lora_alpha", 2 * r},
                                           {"target_modules", targets},
                                           {"bias", "none"}});
  write_safetensors(dir / "adapter_model.safetensors", t);
}

class AdapterTiersTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = Model::load((fs::path(data_dir()) / "models/qwen3-moe-tiny").string());
    dir_ = make_temp_dir("adapter-tiers");
    for (int i = 0; i < kNumAdapters; ++i) write_adapter(dir_ / ("a" + std::to_string(i)), i);
  }
  static void TearDownTestSuite() {
    fs::remove_all(dir_);
    model_.reset();
  }
  static constexpr int kNumAdapters = 1000;
  static inline std::shared_ptr<Model> model_;
  static inline fs::path dir_;

  struct Traffic {
    int adapter;  // -1: base model
    std::vector<int32_t> prompt;
    int64_t max_tokens;
  };
  // Zipf (s = 1.1) over the adapters, a few base-model requests.
  static std::vector<Traffic> zipf_traffic(int n, uint32_t seed) {
    std::vector<double> w(kNumAdapters);
    for (int i = 0; i < kNumAdapters; ++i) w[static_cast<size_t>(i)] = 1.0 / std::pow(i + 1, 1.1);
    std::discrete_distribution<int> zipf(w.begin(), w.end());
    std::mt19937 rng(seed);
    std::vector<Traffic> out;
    for (int i = 0; i < n; ++i) {
      Traffic t;
      t.adapter = i % 10 == 9 ? -1 : zipf(rng);
      for (int k = 0; k < 5 + i % 7; ++k) t.prompt.push_back(static_cast<int32_t>(1 + rng() % 1000));
      t.max_tokens = 2 + i % 4;
      out.push_back(std::move(t));
    }
    return out;
  }

  struct Result {
    std::map<std::string, std::vector<int32_t>> outputs;
    AdapterRegistryStats stats;
    uint64_t max_passed_over = 0;
    int64_t steps = 0;
  };
  // Registers every adapter on disk, submits `per_step` requests before each step, checks the
  // invariants after every step.
  static Result run(const std::vector<Traffic>& traffic, EngineConfig ec, int per_step) {
    Engine engine(model_, ec, nullptr);
    for (int i = 0; i < kNumAdapters; ++i)
      engine.add_adapter_on_disk("a" + std::to_string(i), (dir_ / ("a" + std::to_string(i))).string());
    Result res;
    size_t next = 0;
    while (next < traffic.size() || engine.has_unfinished()) {
      for (int k = 0; k < per_step && next < traffic.size(); ++k, ++next) {
        const Traffic& t = traffic[next];
        EngineRequest r = greedy_request(t.prompt, t.max_tokens, t.adapter < 0 ? "" : "a" + std::to_string(t.adapter));
        r.request_id = "r" + std::to_string(next);
        engine.add_request(std::move(r));
      }
      for (const RequestOutput& o : engine.step()) {
        EXPECT_FALSE(o.error) << o.request_id << ": " << *o.error;
        for (const SequenceOutput& so : o.sequences) {
          auto& v = res.outputs[o.request_id];
          v.insert(v.end(), so.new_token_ids.begin(), so.new_token_ids.end());
        }
      }
      std::string problem = engine.check_invariants();
      if (!problem.empty()) ADD_FAILURE() << "step " << res.steps << ": " << problem;
      if (++res.steps > 20000) {
        ADD_FAILURE() << "the engine did not finish";
        break;
      }
    }
    for (const AdapterEntryInfo& e : engine.adapters()) EXPECT_EQ(e.pins, 0) << e.name;
    res.stats = engine.stats().adapter_tiers;
    res.max_passed_over = engine.max_passed_over_steps();
    return res;
  }
  static EngineConfig config(int64_t max_loras, int64_t max_cpu_loras, bool thread, bool async_uploads = false) {
    EngineConfig ec = test_engine_config(512);
    ec.lora.async_uploads = async_uploads;
    ec.scheduler.max_num_seqs = 32;
    ec.lora.max_loras = max_loras;
    ec.lora.max_cpu_loras = max_cpu_loras;
    ec.lora.max_lora_rank = 8;
    ec.lora.load_thread = thread;
    ec.lora.max_wait_steps = 8;
    return ec;
  }
};

TEST_F(AdapterTiersTest, ZipfTrafficOverFewSlotsMatchesEverythingResident) {
  const auto traffic = zipf_traffic(240, 7);
  std::set<int> distinct;
  for (const Traffic& t : traffic)
    if (t.adapter >= 0) distinct.insert(t.adapter);
  ASSERT_GT(distinct.size(), 40u);  // far more than the 32 host and 4 device places
  Result all = run(traffic, config(static_cast<int64_t>(distinct.size()), kNumAdapters, false), 4);
  Result few = run(traffic, config(4, 32, false), 4);
  ASSERT_EQ(all.outputs.size(), traffic.size());
  ASSERT_EQ(few.outputs.size(), traffic.size());
  for (size_t i = 0; i < traffic.size(); ++i) {
    const std::string id = "r" + std::to_string(i);
    EXPECT_EQ(few.outputs[id], all.outputs[id]) << id << " (adapter " << traffic[i].adapter << ")";
    EXPECT_EQ(static_cast<int64_t>(few.outputs[id].size()), traffic[i].max_tokens) << id;
  }
  // Everything fits: each adapter read from disk and uploaded once, nothing evicted.
  EXPECT_EQ(all.stats.loads_host, static_cast<int64_t>(distinct.size()));
  EXPECT_EQ(all.stats.loads_device, static_cast<int64_t>(distinct.size()));
  EXPECT_EQ(all.stats.evictions_host, 0);
  EXPECT_EQ(all.stats.evictions_device, 0);
  // Few places: every distinct adapter read at least once, some more than once; the host tier evicted
  // (loads - 32 at least), the device tier swapped.
  EXPECT_GT(few.stats.loads_host, static_cast<int64_t>(distinct.size()));
  EXPECT_GE(few.stats.evictions_host, few.stats.loads_host - 32);
  EXPECT_GT(few.stats.loads_device, few.stats.loads_host);
  EXPECT_GE(few.stats.evictions_device, few.stats.loads_device - 4);
  EXPECT_LE(few.stats.resident_device, 4);
  EXPECT_LE(few.stats.resident_host, 32);
  EXPECT_EQ(few.stats.latency_count, few.stats.loads_host);
  // Bounded wait: a ready request sees later ones admitted for at most --lora-max-wait-steps (8) plus the
  // steps the running requests holding every slot take to finish (prompt + 5 tokens: 6 steps), plus the
  // step it became overdue in, the step a slot frees and the step its copy into that slot is made in (a
  // request is admitted only once its adapter is on the device).
  EXPECT_LE(few.max_passed_over, 8u + 6u + 3u);
  std::printf("all resident: %lld steps; 4 slots / 32 host: %lld steps, %lld host loads, %lld uploads, %lld "
              "host evictions, %lld slot evictions, longest pass-over %llu steps\n",
              static_cast<long long>(all.steps), static_cast<long long>(few.steps),
              static_cast<long long>(few.stats.loads_host), static_cast<long long>(few.stats.loads_device),
              static_cast<long long>(few.stats.evictions_host), static_cast<long long>(few.stats.evictions_device),
              static_cast<unsigned long long>(few.max_passed_over));
}

TEST_F(AdapterTiersTest, LoaderThreadGivesTheSameOutputs) {
  const auto traffic = zipf_traffic(40, 11);
  Result inline_loads = run(traffic, config(4, 32, false), 2);
  Result threaded = run(traffic, config(4, 8, true), 2);
  ASSERT_EQ(threaded.outputs.size(), traffic.size());
  for (size_t i = 0; i < traffic.size(); ++i) {
    const std::string id = "r" + std::to_string(i);
    EXPECT_EQ(threaded.outputs[id], inline_loads.outputs[id]) << id;
  }
  EXPECT_GT(threaded.stats.evictions_host, 0);
}

// Device copies on the upload thread (the GPU's default; on the CPU the same thread writes the f32
// stacks): requests wait for their adapter's copy while the others run; outputs are unchanged.
TEST_F(AdapterTiersTest, AsyncUploadsGiveTheSameOutputs) {
  const auto traffic = zipf_traffic(120, 13);
  Result sync = run(traffic, config(4, 32, false), 3);
  Result async = run(traffic, config(4, 32, false, /*async_uploads=*/true), 3);
  ASSERT_EQ(async.outputs.size(), traffic.size());
  for (size_t i = 0; i < traffic.size(); ++i) {
    const std::string id = "r" + std::to_string(i);
    EXPECT_EQ(async.outputs[id], sync.outputs[id]) << id << " (adapter " << traffic[i].adapter << ")";
  }
  EXPECT_GT(async.stats.loads_device, 4);
  // The model's upload-thread copies accumulate over engines: the synchronous run adds none.
  EXPECT_EQ(async.stats.upload_count - sync.stats.upload_count, async.stats.loads_device);
  EXPECT_GT(async.stats.upload_bytes, 0.0);
  EXPECT_EQ(async.stats.uploading_device, 0);
  EXPECT_LE(async.stats.resident_device, 4);
}

// A slow copy into a device slot (held back 1.5 s) stalls only its own request: a base-model request
// submitted with it runs to the end while the copy is still under way; the adapter's request then gives
// the tokens it gives with synchronous copies.
TEST_F(AdapterTiersTest, SlowUploadHoldsBackOnlyItsOwnRequest) {
  const std::vector<int32_t> prompt = {11, 12, 13, 14, 15}, base_prompt = {21, 22, 23};
  const std::string path = (dir_ / "a3").string();
  std::vector<int32_t> expected;
  {
    Engine ref(model_, config(2, 8, false), nullptr);
    ref.add_adapter_on_disk("a3", path);
    EngineRequest r = greedy_request(prompt, 4, "a3");
    r.request_id = "ref";
    ref.add_request(std::move(r));
    while (ref.has_unfinished())
      for (const RequestOutput& o : ref.step())
        for (const SequenceOutput& so : o.sequences)
          expected.insert(expected.end(), so.new_token_ids.begin(), so.new_token_ids.end());
  }
  ASSERT_EQ(expected.size(), 4u);
  model_->set_upload_delay_for_tests(1500);
  Engine engine(model_, config(2, 8, true, /*async_uploads=*/true), nullptr);
  const int64_t uploads_before = engine.stats().adapter_tiers.upload_count;  // the model's copies so far
  engine.add_adapter_on_disk("a3", path);
  std::map<std::string, std::vector<int32_t>> got;
  bool base_done = false, base_done_while_copying = false, copying = false;
  auto step = [&] {
    for (const RequestOutput& o : engine.step()) {
      EXPECT_FALSE(o.error) << o.request_id;
      for (const SequenceOutput& so : o.sequences) {
        auto& v = got[o.request_id];
        v.insert(v.end(), so.new_token_ids.begin(), so.new_token_ids.end());
      }
      if (o.request_id == "base" && o.finished) {
        base_done = true;
        base_done_while_copying = engine.stats().adapter_tiers.uploading_device == 1 && got["slow"].empty();
      }
    }
    ASSERT_EQ(engine.check_invariants(), "");
  };
  EngineRequest slow = greedy_request(prompt, 4, "a3");
  slow.request_id = "slow";
  engine.add_request(std::move(slow));
  // Read from disk on the loader thread, then its copy starts (and is held back).
  const auto t0 = std::chrono::steady_clock::now();
  while (!copying && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10)) {
    step();
    copying = engine.stats().adapter_tiers.uploading_device == 1;
  }
  ASSERT_TRUE(copying);
  EngineRequest base = greedy_request(base_prompt, 6);
  base.request_id = "base";
  engine.add_request(std::move(base));
  while (engine.has_unfinished() && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30)) step();
  model_->set_upload_delay_for_tests(0);
  EXPECT_TRUE(base_done);
  EXPECT_TRUE(base_done_while_copying);
  EXPECT_EQ(got["base"].size(), 6u);
  EXPECT_EQ(got["slow"], expected);
  EXPECT_EQ(engine.stats().adapter_tiers.upload_count - uploads_before, 1);
}

// An engine that goes away while a copy is under way waits for it, so the next engine on the same model
// can take the slot again (the model's stacks are shared).
TEST_F(AdapterTiersTest, EngineGoneDuringACopyLeavesTheSlotUsable) {
  const std::string path = (dir_ / "a5").string();
  auto run_one = [&](Engine& e, bool until_copying) {
    std::vector<int32_t> out;
    EngineRequest r = greedy_request({31, 32, 33}, 3, "a5");
    r.request_id = "q";
    e.add_request(std::move(r));
    const auto t0 = std::chrono::steady_clock::now();
    while (e.has_unfinished() && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20)) {
      for (const RequestOutput& o : e.step())
        for (const SequenceOutput& so : o.sequences) out.insert(out.end(), so.new_token_ids.begin(), so.new_token_ids.end());
      if (until_copying && e.stats().adapter_tiers.uploading_device == 1) break;
    }
    return out;
  };
  std::vector<int32_t> expected;
  {
    Engine ref(model_, config(1, 4, false), nullptr);
    ref.add_adapter_on_disk("a5", path);
    expected = run_one(ref, false);
  }
  ASSERT_EQ(expected.size(), 3u);
  model_->set_upload_delay_for_tests(300);
  {
    Engine gone(model_, config(1, 4, true, /*async_uploads=*/true), nullptr);
    gone.add_adapter_on_disk("a5", path);
    EXPECT_TRUE(run_one(gone, true).empty());
    ASSERT_EQ(gone.stats().adapter_tiers.uploading_device, 1);
  }  // destroyed with the copy under way
  model_->set_upload_delay_for_tests(0);
  Engine next(model_, config(1, 4, true, /*async_uploads=*/true), nullptr);
  next.add_adapter_on_disk("a5", path);
  EXPECT_EQ(run_one(next, false), expected);
}

TEST_F(AdapterTiersTest, CorruptAdapterFailsOnlyItsRequests) {
  fs::path bad = dir_ / "broken";
  fs::create_directories(bad);
  write_json(bad / "adapter_config.json", {{"peft_type", "LORA"}, {"r", 4}, {"lora_alpha", 8},
                                           {"target_modules", {"q_proj"}}});
  {
    std::ofstream(bad / "adapter_model.safetensors") << "not a safetensors file";
  }
  Engine engine(model_, config(4, 8, true), nullptr);
  engine.add_adapter_on_disk("broken", bad.string());
  engine.add_adapter_on_disk("a1", (dir_ / "a1").string());
  std::map<std::string, RequestOutput> last;
  for (const char* name : {"broken", "a1", ""}) {
    EngineRequest r = greedy_request({5, 6, 7, 8}, 3, name);
    r.request_id = std::string("req-") + name;
    engine.add_request(std::move(r));
  }
  std::map<std::string, size_t> tokens;
  for (int steps = 0; engine.has_unfinished() && steps < 2000; ++steps) {
    for (const RequestOutput& o : engine.step()) {
      last[o.request_id] = o;
      for (const auto& so : o.sequences) tokens[o.request_id] += so.new_token_ids.size();
    }
    ASSERT_EQ(engine.check_invariants(), "");
  }
  ASSERT_TRUE(last["req-broken"].error.has_value());
  EXPECT_NE(last["req-broken"].error->find("broken"), std::string::npos) << *last["req-broken"].error;
  EXPECT_FALSE(last["req-a1"].error);
  EXPECT_FALSE(last["req-"].error);
  EXPECT_EQ(tokens["req-a1"], 3u);
  EXPECT_EQ(tokens["req-"], 3u);
  EXPECT_EQ(engine.stats().adapter_tiers.load_failures, 1);
}

// The slot manager alone: a slot a step in flight uses is never taken; LRU among idle ones.
struct RecordingDevice : AdapterDevice {
  std::vector<std::string> log;
  void upload_adapter(int32_t slot, const LoraAdapter& a) override {
    log.push_back("up " + std::to_string(slot) + " " + a.name);
  }
  void free_adapter_slot(int32_t slot) override { log.push_back("free " + std::to_string(slot)); }
};

TEST(AdapterSlots, NeverTakesASlotInFlightAndEvictsLeastRecentlyUsed) {
  RecordingDevice dev;
  AdapterSlots slots(2, &dev);
  std::map<uint64_t, std::shared_ptr<LoraAdapter>> w;
  for (uint64_t v = 1; v <= 3; ++v) {
    w[v] = std::make_shared<LoraAdapter>();
    w[v]->name = "x" + std::to_string(v);
  }
  auto weights = [&](AdapterId id) -> std::shared_ptr<const LoraAdapter> { return w.at(id.version); };
  const AdapterId a{1}, b{2}, c{3};
  ASSERT_TRUE(slots.ensure(1, std::vector<AdapterId>{a, b}, weights));
  // Both slots are used by step 1 in flight: c cannot be placed.
  EXPECT_FALSE(slots.ensure(2, std::vector<AdapterId>{c}, weights));
  EXPECT_EQ(slots.check_invariants(), "");
  slots.retire(1);
  ASSERT_TRUE(slots.ensure(2, std::vector<AdapterId>{b}, weights));  // b is now the most recent
  ASSERT_TRUE(slots.ensure(3, std::vector<AdapterId>{c}, weights));  // takes a's slot (LRU, idle)
  EXPECT_EQ(slots.slot_of(a), -1);
  EXPECT_EQ(slots.slot_of(c), 0);
  EXPECT_EQ(slots.slot_of(b), 1);
  // A dropped adapter whose slot a step still uses goes when that step retires.
  slots.drop(b);
  EXPECT_EQ(slots.slot_of(b), 1);
  slots.retire(2);
  EXPECT_EQ(slots.slot_of(b), -1);
  slots.retire(3);
  EXPECT_EQ(slots.check_invariants(), "");
  EXPECT_EQ(dev.log, (std::vector<std::string>{"up 0 x1", "up 1 x2", "free 0", "up 0 x3", "free 1"}));
  EXPECT_EQ(slots.stats().uploads, 3);
  EXPECT_EQ(slots.stats().evictions, 2);
}

// Asynchronous copies: a prefetched adapter is not placed (no step may use it) until its copy is done;
// prefetch never takes a slot a step in flight uses, one it is told to keep, or one still copying; a
// step that needs an adapter whose copy is under way waits for it.
struct GatedDevice : AdapterDevice {
  std::vector<std::string> log;
  std::map<int32_t, bool> done;  // slot -> copy finished
  void upload_adapter(int32_t slot, const LoraAdapter& a) override {
    log.push_back("up " + std::to_string(slot) + " " + a.name);
  }
  void free_adapter_slot(int32_t slot) override { log.push_back("free " + std::to_string(slot)); }
  void begin_upload(int32_t slot, std::shared_ptr<const LoraAdapter> a) override {
    log.push_back("begin " + std::to_string(slot) + " " + a->name);
    done[slot] = false;
  }
  bool upload_done(int32_t slot) override { return done.at(slot); }
  void finish_upload(int32_t slot) override { log.push_back("finish " + std::to_string(slot)); }
};

TEST(AdapterSlots, PrefetchCopiesWhileStepsRunAndStepsWaitForUnfinishedCopies) {
  GatedDevice dev;
  AdapterSlots slots(3, &dev);
  std::map<uint64_t, std::shared_ptr<LoraAdapter>> w;
  for (uint64_t v = 1; v <= 5; ++v) {
    w[v] = std::make_shared<LoraAdapter>();
    w[v]->name = "x" + std::to_string(v);
  }
  auto weights = [&](AdapterId id) -> std::shared_ptr<const LoraAdapter> { return w.at(id.version); };
  const AdapterId a{1}, b{2}, c{3}, d{4}, e{5};
  ASSERT_TRUE(slots.ensure(1, std::vector<AdapterId>{a}, weights));  // synchronous: slot 0, step 1 in flight
  ASSERT_TRUE(slots.prefetch(b, w[2], {}));                           // slot 1, copying
  EXPECT_FALSE(slots.placed(b));
  EXPECT_TRUE(slots.uploading(b));
  EXPECT_EQ(slots.slot_of(b), 1);
  EXPECT_EQ(slots.stats().uploading, 1);
  EXPECT_TRUE(slots.prefetch(b, w[2], {}));  // already under way: nothing new
  ASSERT_TRUE(slots.prefetch(c, w[3], {}));  // slot 2
  // No slot left: 0 is in flight, 1 and 2 are copying.
  EXPECT_FALSE(slots.prefetch(d, w[4], {}));
  EXPECT_EQ(slots.check_invariants(), "");
  EXPECT_EQ(slots.poll_uploads(), 0);
  dev.done[1] = true;
  EXPECT_EQ(slots.poll_uploads(), 1);
  EXPECT_TRUE(slots.placed(b));
  EXPECT_FALSE(slots.placed(c));
  // A step needing c (still copying) waits for it: finish_upload before the step is placed.
  ASSERT_TRUE(slots.ensure(2, std::vector<AdapterId>{b, c}, weights));
  EXPECT_TRUE(slots.placed(c));
  EXPECT_EQ(slots.stats().uploading, 0);
  slots.retire(1);
  // Slot 0 (a) is idle now, but kept: d finds no slot; without keep it takes a's slot.
  EXPECT_FALSE(slots.prefetch(d, w[4], std::vector<AdapterId>{a}));
  ASSERT_TRUE(slots.prefetch(d, w[4], {}));
  EXPECT_EQ(slots.slot_of(a), -1);
  EXPECT_EQ(slots.slot_of(d), 0);
  // Dropping an adapter whose copy is under way waits for the copy, then frees the slot.
  slots.drop(d);
  EXPECT_EQ(slots.slot_of(d), -1);
  slots.retire(2);
  // The most recently used idle slot is kept over the older one: c (used by step 2 with b; b was placed
  // earlier but used at the same step) -- both idle; the free slot 0 goes first.
  ASSERT_TRUE(slots.prefetch(e, w[5], {}));
  EXPECT_EQ(slots.slot_of(e), 0);
  EXPECT_EQ(slots.check_invariants(), "");
  EXPECT_EQ(dev.log, (std::vector<std::string>{"up 0 x1", "begin 1 x2", "begin 2 x3", "finish 1", "finish 2",
                                               "free 0", "begin 0 x4", "finish 0", "free 0", "begin 0 x5"}));
  EXPECT_EQ(slots.stats().uploads, 4);  // a (synchronous), b, c, d; e still copying
  EXPECT_EQ(slots.stats().evictions, 2);
}

TEST(AdapterRegistry, UnloadWaitsForPinsAndHostTierIsLru) {
  AdapterRegistry::Options o;
  o.max_loras = 2;
  o.max_cpu_loras = 2;
  o.load_thread = false;
  AdapterRegistry reg(o, nullptr);
  int loads = 0;
  auto make = [&](const std::string& name) {
    return [&loads, name] {
      ++loads;
      auto a = std::make_shared<LoraAdapter>();
      a->name = name;
      return a;
    };
  };
  AdapterId x = reg.add_on_disk("x", "/x", make("x"));
  AdapterId y = reg.add_on_disk("y", "/y", make("y"));
  AdapterId z = reg.add_on_disk("z", "/z", make("z"));
  EXPECT_NE(x, y);
  for (AdapterId id : {x, y}) {
    reg.pin(id);
    ASSERT_TRUE(reg.prefetch(id));
  }
  reg.poll();
  EXPECT_TRUE(reg.ready(x) && reg.ready(y));
  reg.pin(z);
  EXPECT_FALSE(reg.prefetch(z));  // host tier full of pinned copies
  reg.unpin(x);
  EXPECT_TRUE(reg.prefetch(z));  // x (unpinned) goes to disk
  reg.poll();
  EXPECT_TRUE(reg.ready(z));
  EXPECT_FALSE(reg.ready(x));
  EXPECT_EQ(loads, 3);
  EXPECT_EQ(reg.check_invariants(), "");
  // Unload while pinned: the name is gone at once, the entry with the last pin.
  EXPECT_TRUE(reg.remove("y"));
  EXPECT_FALSE(reg.has("y"));
  EXPECT_EQ(reg.pins(y), 1);
  AdapterId y2 = reg.add_on_disk("y", "/y", make("y"));
  EXPECT_NE(y2, y);
  reg.unpin(y);
  EXPECT_EQ(reg.pins(y), 0);
  EXPECT_EQ(reg.check_invariants(), "");
  reg.unpin(z);
  EXPECT_EQ(reg.stats().evictions_host, 1);
}

}  // namespace
}  // namespace polylora
