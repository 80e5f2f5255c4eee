// tests/gpu/graph_gpu_test.cc: CUDA graphs of decode steps. A replayed graph must give exactly (bit for
// bit) the logits of the same padded step run eagerly, at every capture size; greedy on the device
// (forward_argmax) must pick the first argmax of those logits; and decoding through the engine with
// graphs must give the same greedy tokens as with --enforce-eager. At start-up every shape is recorded right
// after a dry run (buffers sized, no kernel run), never after an eager run of the dummy step.
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "engine/engine.h"
#include "kernels/tuning.h"
#include "lora/adapter.h"
#include "model/model.h"
#include "worker/kv_storage.h"

namespace polylora {
namespace {

namespace k = kernels;

constexpr int64_t kBlock = 16;
constexpr int64_t kMaxBlocks = 4;  // graphs' block-table width: contexts up to 64 tokens

std::shared_ptr<Backend> cuda(DType dtype) {
  BackendOptions o;
  o.device = DeviceKind::kCuda;
  o.weight_dtype = dtype;
  return make_cuda_backend(o);
}

struct GraphCase {
  std::string model;
  DType dtype;
};

class GraphGpuTest : public ::testing::TestWithParam<GraphCase> {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

// Sequence s owns blocks [s·kMaxBlocks, (s+1)·kMaxBlocks).
int64_t slot_of(int64_t seq, int64_t pos) {
  return (seq * kMaxBlocks + pos / kBlock) * kBlock + pos % kBlock;
}

// A decode step of the first `n` sequences, each at position len[s] with token tok[s].
ForwardBatch decode_batch(int64_t n, const std::vector<int32_t>& len, const std::vector<int32_t>& tok,
                          int64_t width) {
  ForwardBatch b;
  b.max_blocks_per_seq = width;
  b.query_start.push_back(0);
  for (int64_t s = 0; s < n; ++s) {
    b.token_ids.push_back(tok[s]);
    b.positions.push_back(len[s]);
    b.slot_mapping.push_back(slot_of(s, len[s]));
    b.query_start.push_back(static_cast<int32_t>(s + 1));
    b.context_lens.push_back(len[s] + 1);
    b.adapter_slots.push_back(-1);
    b.logits_rows.push_back(static_cast<int32_t>(s));
    int64_t used = (len[s] + 1 + kBlock - 1) / kBlock;
    for (int64_t j = 0; j < width; ++j)
      b.block_tables.push_back(j < used ? static_cast<int32_t>(s * kMaxBlocks + j) : 0);
  }
  return b;
}

// The same step as Model::forward pads it for a graph of `size` sequences.
ForwardBatch padded(const ForwardBatch& b, int64_t size) {
  ForwardBatch p = b;
  const int64_t n = b.num_seqs();
  for (int64_t s = n; s < size; ++s) {
    p.token_ids.push_back(0);
    p.positions.push_back(0);
    p.slot_mapping.push_back(-1);
    p.query_start.push_back(static_cast<int32_t>(s + 1));
    p.context_lens.push_back(1);
    p.adapter_slots.push_back(-1);
    p.logits_rows.push_back(static_cast<int32_t>(s));
    for (int64_t j = 0; j < b.max_blocks_per_seq; ++j) p.block_tables.push_back(0);
  }
  return p;
}

TEST_P(GraphGpuTest, ReplayEqualsEagerAtEverySize) {
  const GraphCase& gc = GetParam();
  auto backend = cuda(gc.dtype);
  auto model = Model::load(std::string(POLYLORA_TEST_DATA) + "/models/" + gc.model, {}, backend);
  const ModelConfig& c = model->config();
  const int64_t V = c.vocab_size, N = 16;
  KvStorage kv(c, *backend, N * kMaxBlocks, kBlock);
  // Prefill 8 sequences of different lengths eagerly.
  std::vector<int32_t> len, tok;
  ForwardBatch pre;
  pre.max_blocks_per_seq = kMaxBlocks;
  pre.query_start.push_back(0);
  for (int64_t s = 0; s < N; ++s) {
    int32_t l = static_cast<int32_t>(3 + 5 * s);
    len.push_back(l);
    tok.push_back(static_cast<int32_t>((s * 37 + 11) % V));
    for (int32_t p = 0; p < l; ++p) {
      pre.token_ids.push_back(static_cast<int32_t>((p * 13 + s * 7 + 1) % V));
      pre.positions.push_back(p);
      pre.slot_mapping.push_back(slot_of(s, p));
    }
    pre.query_start.push_back(static_cast<int32_t>(pre.token_ids.size()));
    pre.context_lens.push_back(l);
    pre.adapter_slots.push_back(-1);
    pre.logits_rows.push_back(static_cast<int32_t>(pre.token_ids.size() - 1));
    for (int64_t j = 0; j < kMaxBlocks; ++j)
      pre.block_tables.push_back(static_cast<int32_t>(s * kMaxBlocks + j));
  }
  std::vector<float> pre_logits(static_cast<size_t>(N * V));
  model->forward(pre, kv.views(), {}, pre_logits.data());

  GraphOptions on;
  on.enabled = true;
  on.sizes = {1, 2, 4, 8};
  on.max_blocks_per_seq = kMaxBlocks;
  on.warmup_tokens = 64;
  on.warmup_logits_rows = 8;
  GraphOptions off;
  for (int64_t n : {1, 2, 3, 4, 5, 8}) {
    const int64_t size = n <= 2 ? n : n <= 4 ? 4 : 8;
    const Model::GraphRecordings before = model->graph_recordings();
    model->prepare_graphs(kv.views(), on);
    ASSERT_TRUE(model->graphs_enabled()) << "graph capture failed";
    // Every shape was recorded right after a dry run (no eager run of the dummy steps at start-up).
    EXPECT_EQ(model->graph_recordings().after_dry_run - before.after_dry_run, 4) << gc.model;
    EXPECT_EQ(model->graph_recordings().after_eager_run, before.after_eager_run) << gc.model;
    ForwardBatch step = decode_batch(n, len, tok, 3);  // narrower tables than the graphs': padded
    std::vector<float> replay(static_cast<size_t>(n * V)), replay2(static_cast<size_t>(n * V));
    model->forward(step, kv.views(), {}, replay.data());
    model->forward(step, kv.views(), {}, replay2.data());
    // Greedy on the device: the ids are the first argmax of the same logits.
    std::vector<int32_t> ids(static_cast<size_t>(n));
    model->forward_argmax(step, kv.views(), {}, ids.data());
    for (int64_t r = 0; r < n; ++r) {
      const float* row = replay.data() + r * V;
      int64_t best = 0;
      for (int64_t i = 1; i < V; ++i)
        if (row[i] > row[best]) best = i;
      EXPECT_EQ(ids[r], best) << gc.model << " n=" << n << " row " << r;
    }
    model->prepare_graphs(kv.views(), off);
    ASSERT_FALSE(model->graphs_enabled());
    ForwardBatch eager_step = padded(decode_batch(n, len, tok, kMaxBlocks), size);
    std::vector<float> eager(static_cast<size_t>(size * V));
    model->forward(eager_step, kv.views(), {}, eager.data());
    size_t mismatches = 0;
    float max_diff = 0;
    for (size_t i = 0; i < replay.size(); ++i) {
      if (std::memcmp(&replay[i], &eager[i], sizeof(float)) != 0) ++mismatches;
      max_diff = std::max(max_diff, std::fabs(replay[i] - eager[i]));
    }
    EXPECT_EQ(mismatches, 0u) << gc.model << " n=" << n << ": replay differs from eager (max |diff| "
                              << max_diff << ")";
    EXPECT_EQ(std::memcmp(replay.data(), replay2.data(), replay.size() * sizeof(float)), 0)
        << gc.model << " n=" << n << ": two replays differ";
    // And the unpadded eager step agrees within rounding (a different split of the KV reads).
    std::vector<float> plain(static_cast<size_t>(n * V));
    model->forward(decode_batch(n, len, tok, 3), kv.views(), {}, plain.data());
    float worst = 0;
    for (size_t i = 0; i < plain.size(); ++i) worst = std::max(worst, std::fabs(plain[i] - replay[i]));
    EXPECT_LT(worst, gc.dtype == DType::kF32 ? 1e-3f : 5e-2f) << gc.model << " n=" << n;
    std::printf(
        "[graph-gpu] %s %s n=%ld (graph %ld): bitwise equal to eager: %s; vs unpadded eager max |diff| "
        "%.2e\n",
        gc.model.c_str(), std::string(dtype_name(gc.dtype)).c_str(), static_cast<long>(n),
        static_cast<long>(size), mismatches == 0 ? "yes" : "NO", worst);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, GraphGpuTest,
                         ::testing::Values(GraphCase{"qwen3-moe-tiny", DType::kF32},
                                           GraphCase{"qwen3-moe-tiny", DType::kBF16},
                                           GraphCase{"gpt-oss-tiny", DType::kBF16},
                                           GraphCase{"llama-tiny", DType::kBF16}),
                         [](const auto& info) {
                           std::string n = info.param.model + "_" + std::string(dtype_name(info.param.dtype));
                           for (char& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

// Decode steps with adapters replay the graphs captured with the slot-stacked LoRA kernels: bit for bit the
// same logits as the same padded step run eagerly, for mixes of adapters, the base model and padding; and
// the LoRA is really applied (the logits differ from the base model's). 13 and 16 sequences (past the
// streamed products' rows: cuBLAS products with the dense shrinks as launches of their own; 16 fills its
// graph, no padding) run with the shrinks beside the products on the side stream (lora_shrink_beside_product
// 1: two branches in the graph); 1 to 8 without.
TEST_P(GraphGpuTest, ReplayWithAdaptersEqualsEager) {
  const GraphCase& gc = GetParam();
  const std::string dir = std::string(POLYLORA_TEST_DATA) + "/models/" + gc.model;
  auto backend = cuda(gc.dtype);
  auto model = Model::load(dir, {}, backend);
  const ModelConfig& c = model->config();
  std::vector<std::shared_ptr<LoraAdapter>> owned;
  for (const char* name : {"experts-attn-r8", "attn-only-r16", "per-expert-r8"}) {
    const std::string path = dir + "/adapters/" + name;
    if (!std::filesystem::exists(path)) continue;
    owned.push_back(load_peft_adapter(path, name, c, {}));
    owned.back()->generation = owned.size();  // registered: stays in its slot across steps
  }
  if (owned.size() < 2) GTEST_SKIP() << gc.model << " has fewer than two fixture adapters";
  model->reserve_adapters(4, 16);
  std::vector<const LoraAdapter*> slots(4, nullptr);
  for (size_t i = 0; i < owned.size(); ++i) slots[i + 1] = owned[i].get();  // slot 0 stays empty
  const int64_t V = c.vocab_size, N = 16;
  KvStorage kv(c, *backend, N * kMaxBlocks, kBlock);
  std::vector<int32_t> len, tok;
  ForwardBatch pre;
  pre.max_blocks_per_seq = kMaxBlocks;
  pre.query_start.push_back(0);
  auto slot_for = [&](int64_t s) {
    return static_cast<int32_t>(s % 4 == 3 ? -1 : 1 + s % static_cast<int64_t>(owned.size()));
  };
  for (int64_t s = 0; s < N; ++s) {
    int32_t l = static_cast<int32_t>(4 + 3 * s);
    len.push_back(l);
    tok.push_back(static_cast<int32_t>((s * 41 + 5) % V));
    for (int32_t p = 0; p < l; ++p) {
      pre.token_ids.push_back(static_cast<int32_t>((p * 17 + s * 5 + 2) % V));
      pre.positions.push_back(p);
      pre.slot_mapping.push_back(slot_of(s, p));
    }
    pre.query_start.push_back(static_cast<int32_t>(pre.token_ids.size()));
    pre.context_lens.push_back(l);
    pre.adapter_slots.push_back(slot_for(s));
    pre.logits_rows.push_back(static_cast<int32_t>(pre.token_ids.size() - 1));
    for (int64_t j = 0; j < kMaxBlocks; ++j)
      pre.block_tables.push_back(static_cast<int32_t>(s * kMaxBlocks + j));
  }
  std::vector<float> pre_logits(static_cast<size_t>(N * V));
  model->forward(pre, kv.views(), slots, pre_logits.data());
  GraphOptions on;
  on.enabled = true;
  on.sizes = {1, 2, 4, 8, 16};
  on.max_blocks_per_seq = kMaxBlocks;
  on.warmup_tokens = 64;
  on.warmup_logits_rows = 16;
  for (int64_t n : {1, 3, 8, 13, 16}) {
    const int64_t size = n <= 2 ? n : n <= 4 ? 4 : n <= 8 ? 8 : 16;
    k::KernelTuning tune = k::kernel_tuning(k::TuningShape{});
    tune.lora_shrink_beside_product = n > 8 ? 1 : 0;
    k::override_kernel_tuning(tune);
    // The step's block tables as narrow as its longest context allows (3 blocks up to 13 sequences, 4 at 16:
    // sequence 15 attends to 50 tokens), narrower than the graphs' kMaxBlocks.
    const int64_t width = (len[n - 1] + 1 + kBlock - 1) / kBlock;
    ForwardBatch step = decode_batch(n, len, tok, width);
    for (int64_t s = 0; s < n; ++s) step.adapter_slots[s] = slot_for(s);
    model->prepare_graphs(kv.views(), on);
    ASSERT_TRUE(model->graphs_enabled());
    std::vector<float> replay(static_cast<size_t>(n * V)), base(static_cast<size_t>(n * V));
    model->forward(step, kv.views(), slots, replay.data());
    ForwardBatch base_step = step;
    for (auto& a : base_step.adapter_slots) a = -1;
    model->forward(base_step, kv.views(), slots, base.data());
    model->prepare_graphs(kv.views(), GraphOptions{});
    ForwardBatch eager_step = padded(decode_batch(n, len, tok, kMaxBlocks), size);
    for (int64_t s = 0; s < n; ++s) eager_step.adapter_slots[s] = slot_for(s);
    std::vector<float> eager(static_cast<size_t>(size * V));
    model->forward(eager_step, kv.views(), slots, eager.data());
    size_t mismatches = 0;
    for (size_t i = 0; i < replay.size(); ++i)
      mismatches += std::memcmp(&replay[i], &eager[i], sizeof(float)) != 0;
    EXPECT_EQ(mismatches, 0u) << gc.model << " n=" << n << ": replay with adapters differs from eager";
    for (int64_t s = 0; s < n; ++s) {
      float diff = 0;
      for (int64_t i = 0; i < V; ++i) diff = std::max(diff, std::fabs(replay[s * V + i] - base[s * V + i]));
      if (slot_for(s) < 0) {
        EXPECT_EQ(diff, 0.0f) << gc.model << " n=" << n << " seq " << s << " (base model) changed";
      } else {
        EXPECT_GT(diff, 1e-4f) << gc.model << " n=" << n << " seq " << s << ": the adapter changed nothing";
      }
    }
  }
  k::override_kernel_tuning(std::nullopt);
}

// Greedy decoding through the engine: graphs on (the default on a GPU), --enforce-eager, and graphs on with
// the start-up's profiling prefill as a dry run (ExecutionConfig::dry_run_profiling: no kernel of the model
// has run before the graphs are recorded) agree.
TEST(GraphEngineGpuTest, GreedyTokensEqualEnforceEager) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  constexpr int kModes = 3;  // graphs, eager, graphs after a dry profiling run
  std::vector<std::vector<int32_t>> outputs[kModes];
  for (int mode = 0; mode < kModes; ++mode) {
    auto backend = cuda(DType::kF32);
    std::shared_ptr<Model> model =
        Model::load(std::string(POLYLORA_TEST_DATA) + "/models/qwen3-moe-tiny", {}, backend);
    EngineConfig ec;
    ec.cache.num_kv_blocks = 256;
    ec.scheduler.max_num_seqs = 16;
    ec.execution.enforce_eager = mode == 1;
    ec.execution.dry_run_profiling = mode == 2;
    Engine engine(model, ec, nullptr);
    EXPECT_EQ(model->graphs_enabled(), mode != 1);
    for (int i = 0; i < 6; ++i) {
      EngineRequest r;
      r.request_id = std::to_string(i);
      for (int p = 0; p < 5 + 3 * i; ++p) r.prompt_ids.push_back((p * 31 + i * 17 + 3) % 900);
      r.sampling.temperature = 0;
      r.sampling.max_tokens = 12;
      r.sampling.ignore_eos = true;
      engine.add_request(std::move(r));
    }
    outputs[mode].resize(6);
    while (engine.has_unfinished())
      for (auto& out : engine.step())
        for (auto& so : out.sequences)
          outputs[mode][std::stoi(out.request_id)].insert(outputs[mode][std::stoi(out.request_id)].end(),
                                                          so.new_token_ids.begin(), so.new_token_ids.end());
  }
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(outputs[0][i].size(), 12u);
    EXPECT_EQ(outputs[0][i], outputs[1][i]) << "request " << i << ": graphs vs eager";
    EXPECT_EQ(outputs[2][i], outputs[1][i])
        << "request " << i << ": graphs after a dry profiling run vs eager";
  }
}

}  // namespace
}  // namespace polylora
