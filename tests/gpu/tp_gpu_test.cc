// tests/gpu/tp_gpu_test.cc: tensor parallelism on the CUDA backend (docs/tensor-parallel.md).
// - On one GPU (ModelLoadOptions::tp_devices all 0: every rank on GPU 0, collectives through host memory):
//   the sharded code path on the GPU - each rank's shard copied to the device, the vocabulary-sharded
//   embedding and LM head, the row-parallel all_reduces, the KV mirrors, the adapters' shards, the fed token
//   ids broadcast to the ranks - gives the numbers of the unsplit model (f32 weights: every logit of a mixed
//   prefill + decode within 1e-3; through the Engine, the same greedy tokens and log-probs within 2e-3);
//   also with expert parallelism (each rank's whole experts over every token, the others' pairs skipped) and
//   fully sharded LoRA.
// - With a GPU per rank (skipped with fewer GPUs): the same over NCCL, with the Engine's CUDA graphs
//   recorded on every rank (the collectives inside).
// - Dummy weights made on each rank's GPU run (finite logits).
// - A GPU list naming a GPU that does not exist is a clear error.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "golden/golden_fixture.h"
#include "golden/tp_batch.h"

namespace polylora::golden {
namespace {

constexpr double kLogitTolerance = 1e-3, kLogprobTolerance = 2e-3;

std::shared_ptr<Backend> cuda_backend() {
  BackendOptions o;
  o.device = DeviceKind::kCuda;
  o.weight_dtype = DType::kF32;
  return make_cuda_backend(o);
}

ModelLoadOptions tp(int n, bool ep = false, bool fs = false) {
  ModelLoadOptions o;
  o.tensor_parallel_size = n;
  o.enable_expert_parallel = ep;
  o.fully_sharded_loras = fs;
  return o;
}

// Every rank on GPU 0 (collectives through host memory).
std::vector<int> same_gpu(int n) {
  return std::vector<int>(static_cast<size_t>(n), 0);
}

// The split model's forward logits and engine runs against the unsplit one on the same GPU.
void expect_split_equals_whole(const std::string& model, int n, const std::vector<int>& devices,
                               bool ep = false, bool fs = false) {
  Fixture one(model, cuda_backend());
  ModelLoadOptions o = tp(n, ep, fs);
  o.tp_devices = devices;
  Fixture split(model, cuda_backend(), o);
  ASSERT_EQ(split.model->tensor_parallel_size(), n);
  ASSERT_EQ(split.model->expert_parallel(), ep);
  ASSERT_EQ(split.model->fully_sharded_loras(), fs);
  MixedBatch mb(one);
  std::vector<int32_t> next;
  TwoSteps ref = run_two_steps(*one.model, mb, nullptr, &next);
  TwoSteps got = run_two_steps(*split.model, MixedBatch(split), &next, nullptr);
  const double dp = max_abs_diff(ref.prefill, got.prefill), dd = max_abs_diff(ref.decode, got.decode);
  EXPECT_LE(dp, kLogitTolerance) << model << " -tp " << n << " prefill logits";
  EXPECT_LE(dd, kLogitTolerance) << model << " -tp " << n << " decode logits";
  // Through the Engine (fed token ids, sampling on rank 0's GPU; CUDA graphs on every rank with NCCL): each
  // variant alone and all mixed.
  std::vector<EngineRequest> reqs;
  for (size_t i = 0; i < one.num_prompts(); ++i)
    for (const std::string& variant : one.variants) reqs.push_back(one.request(variant, i));
  auto mixed = split.run(reqs);
  double worst = 0;
  for (size_t j = 0; j < reqs.size(); ++j) {
    EngineRun ref_run = one.run(reqs[j]);
    EngineRun alone = split.run(reqs[j]);
    EXPECT_EQ(ref_run.output, alone.output) << model << " request " << j;
    EXPECT_EQ(ref_run.output, mixed[j].output) << model << " request " << j << " (mixed)";
    const double da = max_run_diff(ref_run, alone), dm = max_run_diff(ref_run, mixed[j]);
    EXPECT_LE(da, kLogprobTolerance) << model << " request " << j;
    EXPECT_LE(dm, kLogprobTolerance) << model << " request " << j << " (mixed)";
    worst = std::max({worst, da, dm});
  }
  std::printf(
      "[tp-gpu] %s -tp %d%s%s on GPUs %s: max |Δ logit| prefill %.2e decode %.2e; engine max |Δ logprob| "
      "%.2e\n",
      model.c_str(), n, ep ? " -ep" : "", fs ? " -fs" : "", devices.empty() ? "0.." : "all 0", dp, dd, worst);
}

TEST(TensorParallelGpu, RanksOnOneGpuEqualTheWholeModel) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  for (const std::string& model : fixture_models()) expect_split_equals_whole(model, 2, same_gpu(2));
  // 4 ranks: the fixtures' 2 KV heads replicated.
  expect_split_equals_whole("qwen3-moe-tiny", 4, same_gpu(4));
  // Expert parallelism (each rank's whole experts over every token): the MoE models.
  for (const std::string& model : fixture_models())
    if (model != "llama-tiny") expect_split_equals_whole(model, 2, same_gpu(2), /*ep=*/true);
  // Fully sharded LoRA (its shrinks gathered or summed across the ranks, eager steps).
  expect_split_equals_whole("llama-tiny", 2, same_gpu(2), false, /*fs=*/true);
  expect_split_equals_whole("qwen3-moe-tiny", 4, same_gpu(4), false, /*fs=*/true);
}

TEST(TensorParallelGpu, OneGpuPerRankOverNccl) {
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs 2 GPUs (" << cuda_device_count() << " visible)";
  for (const std::string& model : fixture_models()) expect_split_equals_whole(model, 2, {});
  expect_split_equals_whole("gpt-oss-mxfp4-tiny", 2, {}, /*ep=*/true);
  expect_split_equals_whole("gpt-oss-tiny", 2, {}, false, /*fs=*/true);
  if (cuda_device_count() >= 4) expect_split_equals_whole("gpt-oss-tiny", 4, {});
}

// --load-format dummy: each rank makes its shard's weights on its GPU (nothing on the host); a mixed batch
// runs and gives finite logits that are not all equal, on every fixture architecture.
TEST(TensorParallelGpu, DummyWeightsMadeOnEachRank) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  for (const std::string& model : fixture_models()) {
    ModelLoadOptions o = tp(2);
    o.tp_devices = same_gpu(2);
    o.load_format = LoadFormat::kDummy;
    Fixture whole(model, cuda_backend());  // for the batch's prompts
    auto m = Model::load(std::string(POLYLORA_TEST_DATA) + "/models/" + model, o, cuda_backend());
    MixedBatch mb(whole);
    mb.adapters.clear();
    for (int32_t& slot : mb.b.adapter_slots) slot = -1;
    KvStorage kv(m->kv_config(), m->backend(), mb.num_blocks(), MixedBatch::kBlock);
    std::vector<float> logits(mb.b.logits_rows.size() * static_cast<size_t>(m->config().vocab_size));
    m->forward(mb.b, kv.views(), {}, logits.data());
    size_t finite = 0;
    for (float v : logits) finite += std::isfinite(v) ? 1 : 0;
    EXPECT_EQ(finite, logits.size()) << model;
    EXPECT_NE(*std::min_element(logits.begin(), logits.end()),
              *std::max_element(logits.begin(), logits.end()))
        << model;
  }
}

TEST(TensorParallelGpu, BadGpuListIsAnError) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const std::string dir = std::string(POLYLORA_TEST_DATA) + "/models/qwen3-moe-tiny";
  ModelLoadOptions o = tp(2);
  o.tp_devices = {0, 99};
  try {
    Model::load(dir, o, cuda_backend());
    ADD_FAILURE() << "loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'99' is not a GPU index"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace polylora::golden
