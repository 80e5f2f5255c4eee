// tests/gpu/golden_int8_gpu_test.cc: --quantization int8 on the CUDA backend, through Model::load and the
// Engine, on every fixture that is not already quantized (base and every adapter, alone and in one mixed
// batch), against the same INT8 model on the CPU (tests/golden/int8_golden_test.cc relates that one to the
// unquantized model; both quantizers give the same bytes, tests/gpu/int8_gpu_test.cc):
// - --dtype float32: prompt log-probs within 2e-3 and greedy tokens equal up to the first step whose CPU
//   margin is below 2e-3 (as tests/gpu/golden_gpu_test.cc for the unquantized f32 mode);
// - bf16 (the default): vLLM's close-logprobs rule with the CPU run's top-5 at each step.
// Memory: the backend holds less than with the unquantized bf16 model by at least 3/4 of the bytes quantizing
// saved (weights().num_bytes; the rest is allocation rounding): the bf16 copies were freed.
#include "common/error.h"
#include "golden/golden_fixture.h"

namespace polylora::golden {
namespace {

std::shared_ptr<Backend> cuda_backend(DType weights) {
  BackendOptions o;
  o.device = DeviceKind::kCuda;
  o.weight_dtype = weights;
  return make_cuda_backend(o);
}

ModelLoadOptions int8_options() {
  ModelLoadOptions o;
  o.quantization = WeightQuantization::kInt8;
  return o;
}

std::vector<std::string> int8_models() {
  std::vector<std::string> out;
  for (const std::string& m : fixture_models())
    if (m.find("mxfp4") == std::string::npos) out.push_back(m);
  return out;
}

class GoldenInt8GpuTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(GoldenInt8GpuTest, Float32MatchesCpuInt8) {
  Fixture cpu(GetParam(), nullptr, int8_options());
  Fixture f(GetParam(), cuda_backend(DType::kF32), int8_options());
  std::vector<EngineRequest> reqs;
  std::vector<EngineRun> cpu_runs;
  for (const std::string& variant : f.variants)
    for (size_t i = 0; i < f.num_prompts(); ++i) {
      EngineRequest r = f.request(variant, i);
      EngineRun c = cpu.run(r);
      EngineRun g = f.run(r);
      const double d = max_run_diff(c, g);
      std::printf("[golden-int8-gpu f32] %s %s prompt %zu: max |Δ logprob| vs CPU INT8 = %.2e\n",
                  GetParam().c_str(), variant.c_str(), i, d);
      // Logprobs within 2e-3 while the tokens agree; tokens equal up to the CPU's first near-tie.
      for (size_t s = 0; s < c.output.size() && s < g.output.size(); ++s) {
        if (margin_of(c.logprobs[s]) < 2e-3) break;
        ASSERT_EQ(g.output[s], c.output[s]) << variant << " prompt " << i << " step " << s;
      }
      if (g.output == c.output) {
        EXPECT_LE(d, 2e-3) << variant << " prompt " << i;
      }
      reqs.push_back(r);
      cpu_runs.push_back(std::move(c));
    }
  auto mixed = f.run(reqs);
  for (size_t j = 0; j < reqs.size(); ++j)
    if (mixed[j].output == cpu_runs[j].output) {
      EXPECT_LE(max_run_diff(mixed[j], cpu_runs[j]), 2e-3) << j;
    }
}

TEST_P(GoldenInt8GpuTest, Bfloat16CloseLogprobs) {
  Fixture cpu(GetParam(), nullptr, int8_options());
  Fixture f(GetParam(), cuda_backend(DType::kBF16), int8_options());
  std::vector<EngineRequest> reqs;
  std::vector<EngineRun> cpu_runs;
  for (const std::string& variant : f.variants)
    for (size_t i = 0; i < f.num_prompts(); ++i) {
      reqs.push_back(f.request(variant, i, 5, -1));
      cpu_runs.push_back(cpu.run(reqs.back()));
    }
  for (bool mixed : {false, true}) {
    std::vector<EngineRun> results;
    if (mixed) {
      results = f.run(reqs);
    } else {
      for (const auto& r : reqs) results.push_back(f.run(r));
    }
    for (size_t j = 0; j < reqs.size(); ++j) {
      std::vector<std::vector<int32_t>> ref_top;
      std::vector<float> margins;
      for (const LogprobEntry& e : cpu_runs[j].logprobs) {
        std::vector<int32_t> ids;
        for (const auto& t : e.top) ids.push_back(t.id);
        ref_top.push_back(std::move(ids));
        margins.push_back(static_cast<float>(margin_of(e)));
      }
      check_close_logprobs(GetParam() + " request " + std::to_string(j) + (mixed ? " (mixed)" : ""),
                           cpu_runs[j].output, ref_top, results[j], margins.data());
    }
  }
}

TEST_P(GoldenInt8GpuTest, DeviceMemoryHoldsInt8Weights) {
  auto be_bf16 = cuda_backend(DType::kBF16);
  auto be_int8 = cuda_backend(DType::kBF16);
  const std::string dir = std::string(POLYLORA_TEST_DATA) + "/models/" + GetParam();
  auto plain = Model::load(dir, {}, be_bf16);
  auto q = Model::load(dir, int8_options(), be_int8);
  const size_t saved = plain->weights().num_bytes - q->weights().num_bytes;
  ASSERT_GT(saved, 0u);
  EXPECT_LE(be_int8->allocated_bytes() + saved * 3 / 4, be_bf16->allocated_bytes())
      << "bf16 " << be_bf16->allocated_bytes() << " int8 " << be_int8->allocated_bytes() << " saved "
      << saved;
}

TEST(GoldenInt8Gpu, RefusedOnMxfp4Checkpoint) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  EXPECT_THROW(Model::load(std::string(POLYLORA_TEST_DATA) + "/models/gpt-oss-mxfp4-tiny", int8_options(),
                           cuda_backend(DType::kBF16)),
               Error);
}

INSTANTIATE_TEST_SUITE_P(Models, GoldenInt8GpuTest, ::testing::ValuesIn(int8_models()), [](const auto& info) {
  std::string n = info.param;
  for (char& c : n)
    if (c == '-') c = '_';
  return n;
});

}  // namespace
}  // namespace polylora::golden
