// tests/engine/engine_kv_dtype_test.cc: --kv-cache-dtype on the CPU backend. The cache's element type
// sizes its blocks (BF16: half of F32's bytes, so --kv-cache-memory holds twice the blocks), and a BF16
// cache is refused by name on the CPU backend (its kernels keep the cache in f32); the engine with the
// default F32 cache serves as before. The BF16 cache itself runs on CUDA backends: tests/gpu
// (GpuAttention.Bf16Cache, GpuWriteKv.*, GpuFusedOps.RopeKvWriteBf16Cache, GoldenGpuTest.*Cache*).
#include <gtest/gtest.h>

#include "common/error.h"
#include "golden/golden_fixture.h"
#include "worker/kv_storage.h"

namespace polylora::golden {
namespace {

TEST(EngineKvCacheDtype, Bf16BlocksAreHalfTheBytes) {
  Fixture fixture("qwen3-moe-tiny");
  const ModelConfig& c = fixture.model->kv_config();
  const int64_t f32 = KvStorage::bytes_per_block(c, 16, DType::kF32);
  EXPECT_EQ(f32, 2 * c.num_layers * 16 * c.num_kv_heads * c.head_dim * 4);
  EXPECT_EQ(KvStorage::bytes_per_block(c, 16, DType::kBF16) * 2, f32);
  EXPECT_EQ(KvStorage::bytes_per_block(c, 16), f32);  // the default
}

TEST(EngineKvCacheDtype, Bf16CacheIsRefusedOnTheCpuBackend) {
  Fixture fixture("qwen3-moe-tiny");
  std::shared_ptr<Model> model(std::move(fixture.model));
  EngineConfig ec;
  ec.cache.block_size = 4;
  ec.cache.num_kv_blocks = 64;
  ec.scheduler.max_model_len = 64;
  ec.cache.kv_cache_dtype = DType::kBF16;
  try {
    Engine engine(model, ec, nullptr);
    FAIL() << "a BF16 KV cache was accepted on the CPU backend";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--kv-cache-dtype bfloat16"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("CUDA"), std::string::npos) << e.what();
  }
  // The CPU kernels refuse a BF16 view too (a caller that bypassed the storage).
  kernels::KvCacheView v;
  v.dtype = DType::kBF16;
  EXPECT_THROW(kernels::check_f32_cache(v, "attention"), Error);
  // And the default F32 cache serves.
  ec.cache.kv_cache_dtype = DType::kF32;
  Engine engine(model, ec, nullptr);
  EngineRequest r;
  r.request_id = "a";
  r.prompt_ids = {1, 2, 3};
  r.sampling.temperature = 0;
  r.sampling.max_tokens = 2;
  r.sampling.ignore_eos = true;
  EngineRun run = testing_util::run_one(engine, std::move(r));
  EXPECT_EQ(run.output.size(), 2u);
}

}  // namespace
}  // namespace polylora::golden
