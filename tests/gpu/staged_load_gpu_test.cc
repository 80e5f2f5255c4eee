// tests/gpu/staged_load_gpu_test.cc: the staged weight loader on CUDA (pinned staging ring, copy and
// conversion streams, device transposes and conversions) against the per-tensor path it replaces: written
// checkpoints (bf16 and f32) of the tiny models, loaded both ways into BF16 and F32 backends with tiny
// staging buffers (every tensor split into many chunks, rows split where one does not fit), give
// bit-identical parameters in device memory.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "engine/engine.h"
#include "model/checkpoint_writer.h"
#include "model/model.h"
#include "unit/engine_run.h"
#include "unit/test_util.h"

namespace polylora {
namespace {

namespace fs = std::filesystem;

#define SKIP_WITHOUT_GPU_HERE() \
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU on this machine"

std::vector<std::byte> to_host(Backend& be, const void* p, size_t bytes) {
  std::vector<std::byte> out(bytes);
  if (bytes) be.copy_to_host(out.data(), p, bytes);
  return out;
}

void expect_same(Backend& be, const kernels::WeightView& a, const kernels::WeightView& b,
                 const std::string& what) {
  ASSERT_EQ(a.empty(), b.empty()) << what;
  if (a.empty()) return;
  ASSERT_EQ(a.dtype, b.dtype) << what;
  ASSERT_EQ(a.rows, b.rows) << what;
  ASSERT_EQ(a.cols, b.cols) << what;
  const size_t n = static_cast<size_t>(a.rows * a.cols) * dtype_size(a.dtype);
  EXPECT_TRUE(to_host(be, a.data, n) == to_host(be, b.data, n)) << what;
}

void expect_same(Backend& be, const float* a, const float* b, int64_t n, const std::string& what) {
  ASSERT_EQ(a == nullptr, b == nullptr) << what;
  if (!a) return;
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  EXPECT_TRUE(to_host(be, a, bytes) == to_host(be, b, bytes)) << what;
}

void expect_same_weights(Backend& be, const Model& x, const Model& y) {
  const ModelConfig& c = x.config();
  const ModelWeights& a = x.weights();
  const ModelWeights& b = y.weights();
  expect_same(be, a.embed, b.embed, "embed");
  expect_same(be, a.lm_head, b.lm_head, "lm_head");
  expect_same(be, a.final_norm, b.final_norm, c.hidden_size, "final_norm");
  ASSERT_EQ(a.layers.size(), b.layers.size());
  for (size_t l = 0; l < a.layers.size(); ++l) {
    const LayerWeights& p = a.layers[l];
    const LayerWeights& q = b.layers[l];
    const std::string at = " of layer " + std::to_string(l);
    expect_same(be, p.input_norm, q.input_norm, c.hidden_size, "input_norm" + at);
    expect_same(be, p.post_attention_norm, q.post_attention_norm, c.hidden_size, "post_norm" + at);
    const LinearWeights* pl[] = {&p.attn.q, &p.attn.k, &p.attn.v, &p.attn.o};
    const LinearWeights* ql[] = {&q.attn.q, &q.attn.k, &q.attn.v, &q.attn.o};
    for (int i = 0; i < 4; ++i) {
      expect_same(be, pl[i]->w, ql[i]->w, "attention weight " + std::to_string(i) + at);
      expect_same(be, pl[i]->bias, ql[i]->bias, pl[i]->w.rows, "attention bias " + std::to_string(i) + at);
    }
    expect_same(be, p.attn.sinks, q.attn.sinks, c.num_heads, "sinks" + at);
    expect_same(be, p.attn.q_norm, q.attn.q_norm, c.head_dim, "q_norm" + at);
    expect_same(be, p.attn.k_norm, q.attn.k_norm, c.head_dim, "k_norm" + at);
    if (!p.is_moe) {
      expect_same(be, p.mlp.gate.w, q.mlp.gate.w, "gate" + at);
      expect_same(be, p.mlp.up.w, q.mlp.up.w, "up" + at);
      expect_same(be, p.mlp.down.w, q.mlp.down.w, "down" + at);
      continue;
    }
    expect_same(be, p.moe.router.w, q.moe.router.w, "router" + at);
    expect_same(be, p.moe.router.bias, q.moe.router.bias, c.num_experts, "router bias" + at);
    ASSERT_EQ(p.moe.experts.size(), q.moe.experts.size());
    std::vector<kernels::ExpertView> table(q.moe.experts.size());
    be.copy_to_host(table.data(), q.moe.experts_on_device, table.size() * sizeof(kernels::ExpertView));
    for (size_t e = 0; e < p.moe.experts.size(); ++e) {
      const kernels::ExpertView& pe = p.moe.experts[e];
      const kernels::ExpertView& qe = q.moe.experts[e];
      const std::string ex = " of expert " + std::to_string(e) + at;
      expect_same(be, pe.gate_up, qe.gate_up, "gate_up" + ex);
      expect_same(be, pe.gate, qe.gate, "gate" + ex);
      expect_same(be, pe.up, qe.up, "up" + ex);
      expect_same(be, pe.down, qe.down, "down" + ex);
      expect_same(be, pe.gate_up_bias, qe.gate_up_bias, pe.gate_up.rows, "gate_up bias" + ex);
      expect_same(be, pe.down_bias, qe.down_bias, pe.down.rows, "down bias" + ex);
      EXPECT_EQ(table[e].gate_up.data, qe.gate_up.data) << ex;
      EXPECT_EQ(table[e].down.data, qe.down.data) << ex;
      EXPECT_EQ(table[e].down_bias, qe.down_bias) << ex;
    }
  }
}

struct Case {
  std::string model;
  DType checkpoint_dtype;
  DType weight_dtype;
};

class StagedLoadGpu : public ::testing::TestWithParam<Case> {};

TEST_P(StagedLoadGpu, EqualsThePerTensorPath) {
  SKIP_WITHOUT_GPU_HERE();
  const Case& c = GetParam();
  fs::path cfg = testing_util::make_temp_dir("gpu-staged-cfg");
  fs::copy_file(fs::path(testing_util::data_dir()) / "models" / c.model / "config.json", cfg / "config.json");
  fs::path out = testing_util::make_temp_dir("gpu-staged");
  CheckpointWriteOptions wo;
  wo.num_shards = 2;
  wo.dtype = c.checkpoint_dtype;
  write_random_checkpoint(cfg.string(), out.string(), wo);
  std::shared_ptr<Backend> be =
      make_cuda_backend({.device = DeviceKind::kCuda, .device_index = 0, .weight_dtype = c.weight_dtype});
  ModelLoadOptions per_tensor;
  per_tensor.upload.path = UploadPath::kPerTensor;
  auto reference = Model::load(out.string(), per_tensor, be);
  for (size_t buffer_bytes : {size_t{4096}, size_t{1} << 20}) {
    ModelLoadOptions staged;
    staged.upload.path = UploadPath::kStaged;
    staged.upload.num_threads = 3;
    staged.upload.num_buffers = 4;
    staged.upload.buffer_bytes = buffer_bytes;
    auto m = Model::load(out.string(), staged, be);
    SCOPED_TRACE("staging buffers of " + std::to_string(buffer_bytes) + " bytes");
    expect_same_weights(*be, *reference, *m);
  }
  auto automatic = Model::load(out.string(), {}, be);  // kAuto is the staged path on CUDA
  expect_same_weights(*be, *reference, *automatic);
  fs::remove_all(cfg);
  fs::remove_all(out);
}

INSTANTIATE_TEST_SUITE_P(TinyModels, StagedLoadGpu,
                         ::testing::Values(Case{"gpt-oss-tiny", DType::kBF16, DType::kBF16},
                                           Case{"gpt-oss-tiny", DType::kF32, DType::kBF16},
                                           Case{"gpt-oss-tiny", DType::kBF16, DType::kF32},
                                           Case{"qwen3-moe-tiny", DType::kF16, DType::kBF16},
                                           Case{"llama-tiny", DType::kF32, DType::kF32},
                                           Case{"mixtral-tiny", DType::kBF16, DType::kBF16}));

// The background load `serve` uses: the engine's start-up (dry-run profiling, KV cache, CUDA graphs recorded
// on the compute stream) runs while the reads are held, the reads then go on beside the recorded graphs,
// and the engine waits for them: its greedy tokens (graphs replayed) equal an engine's on the per-tensor
// load, and the weights are the per-tensor load's bit for bit.
TEST(StagedLoadGpuBackground, EngineStartsWhileTheWeightsCopy) {
  SKIP_WITHOUT_GPU_HERE();
  fs::path cfg = testing_util::make_temp_dir("gpu-bg-cfg");
  fs::copy_file(fs::path(testing_util::data_dir()) / "models" / "gpt-oss-tiny" / "config.json",
                cfg / "config.json");
  fs::path out = testing_util::make_temp_dir("gpu-bg");
  CheckpointWriteOptions wo;
  wo.num_shards = 2;
  write_random_checkpoint(cfg.string(), out.string(), wo);
  std::shared_ptr<Backend> be =
      make_cuda_backend({.device = DeviceKind::kCuda, .device_index = 0, .weight_dtype = DType::kF32});
  ModelLoadOptions per_tensor;
  per_tensor.upload.path = UploadPath::kPerTensor;
  std::shared_ptr<Model> reference = Model::load(out.string(), per_tensor, be);
  ModelLoadOptions bg;
  bg.upload.background = true;
  bg.upload.num_threads = 2;
  bg.upload.num_buffers = 3;
  bg.upload.buffer_bytes = 4096;  // many chunks
  std::promise<void> go;
  std::shared_future<void> released = go.get_future().share();
  bool held_too_long = false;
  bg.upload.before_reads = [released, &held_too_long] {
    if (released.wait_for(std::chrono::seconds(60)) != std::future_status::ready) held_too_long = true;
  };
  std::shared_ptr<Model> m = Model::load(out.string(), bg, be);
  std::thread release([&go] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    go.set_value();
  });
  EngineConfig ec = testing_util::test_engine_config();
  ec.scheduler.max_num_seqs = 8;
  ec.execution.cuda_graph_sizes = {1, 2, 4, 8};
  Engine engine(m, ec, nullptr);
  release.join();
  EXPECT_FALSE(held_too_long);
  EXPECT_TRUE(m->graphs_enabled());
  expect_same_weights(*be, *reference, *m);
  Engine want_engine(reference, ec, nullptr);
  std::vector<testing_util::EngineRun> got, want;
  for (Engine* e : {&engine, &want_engine}) {
    std::vector<EngineRequest> rs;
    for (const std::vector<int32_t>& prompt :
         {std::vector<int32_t>{3, 17, 42, 5, 9}, std::vector<int32_t>{100, 7}, std::vector<int32_t>{1}})
      rs.push_back(testing_util::greedy_request(prompt, 8));
    (e == &engine ? got : want) = testing_util::run_to_completion(*e, std::move(rs));
  }
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i].output, want[i].output) << "request " << i;
  fs::remove_all(cfg);
  fs::remove_all(out);
}

}  // namespace
}  // namespace polylora
