// tests/unit/model/fast_load_test.cc: the checkpoint writer (model/checkpoint_writer.h) and the staged
// loader (model/weight_upload.h) on the CPU backend: a written checkpoint loads through both paths
// (zero-copy views and staged copies with small buffers, so tensors are split into many chunks) with
// bit-identical parameters equal to the file's bytes (experts transposed); its forward pass is finite; the
// host staging's conversions and transposes; files truncated or removed after their headers were read are
// errors naming the tensor and file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <future>

#include "common/error.h"
#include "engine/engine.h"
#include "model/arch/arch.h"
#include "model/checkpoint_writer.h"
#include "model/model.h"
#include "runtime/safetensors.h"
#include "runtime/safetensors_writer.h"
#include "unit/engine_run.h"
#include "unit/test_util.h"
#include "worker/kv_storage.h"

namespace polylora {
namespace {

namespace fs = std::filesystem;
using namespace testing_util;

fs::path config_dir_of(const std::string& model, const std::string& tag) {
  fs::path dir = make_temp_dir(tag + "-config");
  fs::copy_file(fs::path(data_dir()) / "models" / model / "config.json", dir / "config.json");
  return dir;
}

ModelLoadOptions staged(size_t buffer_bytes = 4096) {
  ModelLoadOptions o;
  o.upload.path = UploadPath::kStaged;
  o.upload.num_threads = 3;
  o.upload.num_buffers = 4;
  o.upload.buffer_bytes = buffer_bytes;
  return o;
}

size_t matrix_bytes(const kernels::WeightView& w) {
  return static_cast<size_t>(w.rows * w.cols) * dtype_size(w.dtype);
}

void expect_same_matrix(const kernels::WeightView& a, const kernels::WeightView& b, const std::string& what) {
  ASSERT_EQ(a.empty(), b.empty()) << what;
  if (a.empty()) return;
  ASSERT_EQ(a.dtype, b.dtype) << what;
  ASSERT_EQ(a.rows, b.rows) << what;
  ASSERT_EQ(a.cols, b.cols) << what;
  EXPECT_EQ(std::memcmp(a.data, b.data, matrix_bytes(a)), 0) << what;
}

void expect_same_vector(const float* a, const float* b, int64_t n, const std::string& what) {
  ASSERT_EQ(a == nullptr, b == nullptr) << what;
  if (!a) return;
  EXPECT_EQ(std::memcmp(a, b, static_cast<size_t>(n) * sizeof(float)), 0) << what;
}

// Every parameter of two loads of one model is bit-identical.
void expect_same_weights(const Model& x, const Model& y) {
  const ModelConfig& c = x.config();
  const ModelWeights& a = x.weights();
  const ModelWeights& b = y.weights();
  expect_same_matrix(a.embed, b.embed, "embed");
  expect_same_matrix(a.lm_head, b.lm_head, "lm_head");
  expect_same_vector(a.final_norm, b.final_norm, c.hidden_size, "final_norm");
  ASSERT_EQ(a.layers.size(), b.layers.size());
  EXPECT_EQ(a.num_bytes, b.num_bytes);
  for (size_t l = 0; l < a.layers.size(); ++l) {
    const LayerWeights& p = a.layers[l];
    const LayerWeights& q = b.layers[l];
    const std::string at = " of layer " + std::to_string(l);
    expect_same_vector(p.input_norm, q.input_norm, c.hidden_size, "input_norm" + at);
    expect_same_vector(p.post_attention_norm, q.post_attention_norm, c.hidden_size, "post_norm" + at);
    const LinearWeights* pl[] = {&p.attn.q, &p.attn.k, &p.attn.v, &p.attn.o};
    const LinearWeights* ql[] = {&q.attn.q, &q.attn.k, &q.attn.v, &q.attn.o};
    for (int i = 0; i < 4; ++i) {
      expect_same_matrix(pl[i]->w, ql[i]->w, "attention weight " + std::to_string(i) + at);
      expect_same_vector(pl[i]->bias, ql[i]->bias, pl[i]->w.rows, "attention bias " + std::to_string(i) + at);
    }
    expect_same_vector(p.attn.sinks, q.attn.sinks, c.num_heads, "sinks" + at);
    expect_same_vector(p.attn.q_norm, q.attn.q_norm, c.head_dim, "q_norm" + at);
    expect_same_vector(p.attn.k_norm, q.attn.k_norm, c.head_dim, "k_norm" + at);
    ASSERT_EQ(p.is_moe, q.is_moe);
    if (!p.is_moe) {
      expect_same_matrix(p.mlp.gate.w, q.mlp.gate.w, "gate" + at);
      expect_same_matrix(p.mlp.up.w, q.mlp.up.w, "up" + at);
      expect_same_matrix(p.mlp.down.w, q.mlp.down.w, "down" + at);
      continue;
    }
    expect_same_matrix(p.moe.router.w, q.moe.router.w, "router" + at);
    expect_same_vector(p.moe.router.bias, q.moe.router.bias, c.num_experts, "router bias" + at);
    ASSERT_EQ(p.moe.experts.size(), q.moe.experts.size());
    for (size_t e = 0; e < p.moe.experts.size(); ++e) {
      const kernels::ExpertView& pe = p.moe.experts[e];
      const kernels::ExpertView& qe = q.moe.experts[e];
      const std::string ex = " of expert " + std::to_string(e) + at;
      expect_same_matrix(pe.gate_up, qe.gate_up, "gate_up" + ex);
      expect_same_matrix(pe.gate, qe.gate, "gate" + ex);
      expect_same_matrix(pe.up, qe.up, "up" + ex);
      expect_same_matrix(pe.down, qe.down, "down" + ex);
      expect_same_vector(pe.gate_up_bias, qe.gate_up_bias, pe.gate_up.rows, "gate_up bias" + ex);
      expect_same_vector(pe.down_bias, qe.down_bias, pe.down.rows, "down bias" + ex);
      // The device copy of the expert table points at the same (staged: backend) memory.
      EXPECT_EQ(std::memcmp(&q.moe.experts_on_device[e], &qe, sizeof(qe)), 0) << ex;
    }
  }
}

// Logits of a short prompt: finite, and not all equal.
void expect_finite_forward(Model& m) {
  const ModelConfig& c = m.config();
  KvStorage kv(c, m.backend(), 4, 16);
  ForwardBatch b;
  b.token_ids = {1, 5, 9, 2};
  b.positions = {0, 1, 2, 3};
  b.query_start = {0, 4};
  b.context_lens = {4};
  b.max_blocks_per_seq = 1;
  b.block_tables = {0};
  b.slot_mapping = {0, 1, 2, 3};
  b.adapter_slots = {-1};
  b.logits_rows = {3};
  std::vector<float> logits(static_cast<size_t>(c.vocab_size));
  m.forward(b, kv.views(), {}, logits.data());
  float lo = logits[0], hi = logits[0];
  for (float v : logits) {
    ASSERT_TRUE(std::isfinite(v));
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  EXPECT_LT(lo, hi);
}

TEST(CheckpointWriter, GptOssNamesShapesAndSizeOfTheRealConfig) {
  // The published GPT-OSS-20B config (as in ../shared/fixtures/real-configs): its bf16 layout.
  ModelConfig cfg =
      ModelConfig::from_json(R"({"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss",
      "attention_bias": true, "head_dim": 64, "hidden_size": 2880, "intermediate_size": 2880,
      "num_attention_heads": 64, "num_key_value_heads": 8, "num_hidden_layers": 24, "num_local_experts": 32,
      "experts_per_token": 4, "num_experts_per_tok": 4, "vocab_size": 201088, "sliding_window": 128,
      "rms_norm_eps": 1e-05, "rope_theta": 150000, "max_position_embeddings": 131072, "tie_word_embeddings": false,
      "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
        "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": false},
      "swiglu_limit": 7.0})",
                             "gpt-oss-20b");
  std::vector<ExpectedTensor> t = arch::expected_tensors(cfg);
  std::map<std::string, std::vector<int64_t>> shapes;
  uint64_t bytes = 0;
  for (const ExpectedTensor& e : t) {
    EXPECT_TRUE(shapes.emplace(e.name, e.shape).second) << e.name;
    bytes += TensorSpec{e.name, DType::kBF16, e.shape}.num_bytes();
  }
  // 17 per layer: the MXFP4 index's 19 with each expert tensor's _blocks/_scales pair as one bf16 tensor.
  EXPECT_EQ(t.size(), 3u + 24u * 17u);
  using Shape = std::vector<int64_t>;
  EXPECT_EQ(shapes["model.layers.0.mlp.experts.gate_up_proj"], (Shape{32, 2880, 5760}));
  EXPECT_EQ(shapes["model.layers.23.mlp.experts.down_proj"], (Shape{32, 2880, 2880}));
  EXPECT_EQ(shapes["model.layers.5.mlp.experts.gate_up_proj_bias"], (Shape{32, 5760}));
  EXPECT_EQ(shapes["model.layers.5.mlp.experts.down_proj_bias"], (Shape{32, 2880}));
  EXPECT_EQ(shapes["model.layers.1.mlp.router.weight"], (Shape{32, 2880}));
  EXPECT_EQ(shapes["model.layers.1.mlp.router.bias"], (Shape{32}));
  EXPECT_EQ(shapes["model.layers.2.self_attn.q_proj.weight"], (Shape{4096, 2880}));
  EXPECT_EQ(shapes["model.layers.2.self_attn.k_proj.bias"], (Shape{512}));
  EXPECT_EQ(shapes["model.layers.2.self_attn.o_proj.weight"], (Shape{2880, 4096}));
  EXPECT_EQ(shapes["model.layers.2.self_attn.o_proj.bias"], (Shape{2880}));
  EXPECT_EQ(shapes["model.layers.2.self_attn.sinks"], (Shape{64}));
  EXPECT_EQ(shapes["model.embed_tokens.weight"], (Shape{201088, 2880}));
  EXPECT_EQ(shapes["lm_head.weight"], (Shape{201088, 2880}));
  EXPECT_EQ(shapes["model.norm.weight"], (Shape{2880}));
  EXPECT_NEAR(static_cast<double>(bytes) / 1e9, 41.8, 0.1);
}

TEST(CheckpointWriter, ShardsWithAnIndexAndStrictlyValidHeaders) {
  fs::path cfg = config_dir_of("gpt-oss-tiny", "shards");
  fs::path out = make_temp_dir("shards-out");
  CheckpointWriteOptions o;
  o.num_shards = 3;
  o.num_threads = 2;
  o.chunk_bytes = 8192;
  CheckpointWriteStats st = write_random_checkpoint(cfg.string(), out.string(), o);
  EXPECT_EQ(st.num_files, 3u);
  EXPECT_TRUE(fs::exists(out / "config.json"));
  EXPECT_TRUE(fs::exists(out / "model.safetensors.index.json"));
  EXPECT_TRUE(fs::exists(out / "model-00003-of-00003.safetensors"));
  nlohmann::json index = read_json(out / "model.safetensors.index.json");
  EXPECT_EQ(index["weight_map"].size(), st.num_tensors);
  Checkpoint ckpt = Checkpoint::open_dir(out.string());  // every header passes the strict reader
  const TensorInfo& norm = ckpt.get("model.layers.0.input_layernorm.weight");
  EXPECT_EQ(norm.dtype, DType::kBF16);
  EXPECT_EQ(norm.file_offset % 8, 0u);  // headers are padded to 8 bytes
  std::vector<float> v(static_cast<size_t>(norm.numel()));
  convert_to_f32(norm.data, norm.dtype, v.size(), v.data());
  for (float x : v) EXPECT_NEAR(x, 1.0f, 0.024f);  // norms around 1 (± scale, and bf16 steps of 1/128 there)
  const TensorInfo& q = ckpt.get("model.layers.0.self_attn.q_proj.weight");
  std::vector<float> w(static_cast<size_t>(q.numel()));
  convert_to_f32(q.data, q.dtype, w.size(), w.data());
  double sum_sq = 0;
  for (float x : w) {
    EXPECT_LE(std::fabs(x), 0.0201f);
    sum_sq += x * x;
  }
  EXPECT_NEAR(std::sqrt(sum_sq / static_cast<double>(w.size())), 0.02 / std::sqrt(3.0), 0.002);
  // Writing again replaces the shards (a single file now; no stale index).
  o.num_shards = 1;
  write_random_checkpoint(cfg.string(), out.string(), o);
  EXPECT_TRUE(fs::exists(out / "model.safetensors"));
  EXPECT_FALSE(fs::exists(out / "model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(out / "model-00001-of-00003.safetensors"));
  fs::remove_all(cfg);
  fs::remove_all(out);
}

class RoundTrip : public ::testing::TestWithParam<std::string> {};

TEST_P(RoundTrip, StagedLoadEqualsZeroCopyLoad) {
  fs::path cfg = config_dir_of(GetParam(), "rt");
  fs::path out = make_temp_dir("rt-out");
  CheckpointWriteOptions o;
  o.num_shards = 2;
  write_random_checkpoint(cfg.string(), out.string(), o);
  auto zero_copy = Model::load(out.string());
  auto copied = Model::load(out.string(), staged());
  expect_same_weights(*zero_copy, *copied);
  auto big_buffers = Model::load(out.string(), staged(size_t{1} << 20));
  expect_same_weights(*zero_copy, *big_buffers);
  expect_finite_forward(*copied);
  fs::remove_all(cfg);
  fs::remove_all(out);
}

INSTANTIATE_TEST_SUITE_P(TinyModels, RoundTrip,
                         ::testing::Values("gpt-oss-tiny", "llama-tiny", "qwen3-moe-tiny", "mixtral-tiny"));

TEST(StagedLoad, ValuesAreTheFilesBytesWithExpertsTransposed) {
  fs::path cfg = config_dir_of("gpt-oss-tiny", "values");
  fs::path out = make_temp_dir("values-out");
  write_random_checkpoint(cfg.string(), out.string(), {});
  Checkpoint ckpt = Checkpoint::open_dir(out.string());
  auto m = Model::load(out.string(), staged());
  const ModelWeights& w = m->weights();
  ASSERT_NE(w.embed.data, ckpt.get("model.embed_tokens.weight").data);  // a copy, not the mapping
  EXPECT_EQ(std::memcmp(w.embed.data, ckpt.get("model.embed_tokens.weight").data, matrix_bytes(w.embed)), 0);
  const TensorInfo& gu = ckpt.get("model.layers.1.mlp.experts.gate_up_proj");  // [E, H, 2I]
  const int64_t h = gu.shape[1], two_i = gu.shape[2];
  for (int64_t e : {int64_t{0}, gu.shape[0] - 1}) {
    const kernels::WeightView& v = w.layers[1].moe.experts[static_cast<size_t>(e)].gate_up;  // [2I, H]
    ASSERT_EQ(v.rows, two_i);
    ASSERT_EQ(v.cols, h);
    const auto* src = static_cast<const uint16_t*>(gu.data) + e * h * two_i;
    const auto* dst = static_cast<const uint16_t*>(v.data);
    for (int64_t r = 0; r < two_i; ++r)
      for (int64_t c = 0; c < h; ++c)
        ASSERT_EQ(dst[r * h + c], src[c * two_i + r]) << e << " " << r << " " << c;
  }
  const TensorInfo& bias = ckpt.get("model.layers.2.mlp.experts.down_proj_bias");  // [E, H]
  std::vector<float> row(static_cast<size_t>(bias.shape[1]));
  const int64_t e = 3;
  convert_to_f32(static_cast<const uint16_t*>(bias.data) + e * bias.shape[1], DType::kBF16, row.size(),
                 row.data());
  EXPECT_EQ(std::memcmp(w.layers[2].moe.experts[e].down_bias, row.data(), row.size() * sizeof(float)), 0);
  fs::remove_all(cfg);
  fs::remove_all(out);
}

// A background load (WeightUploadOptions::background, as `serve` loads): load() returns before any byte is
// read (the reads are held until it has returned: a load that waited for them would time out the hold),
// the weights are then the foreground load's bit for bit, and an engine started on the model before they
// are in place generates what an engine on the zero-copy model generates.
TEST(StagedLoad, InTheBackgroundReturnsBeforeReadingAndEqualsTheForegroundLoad) {
  fs::path cfg = config_dir_of("qwen3-moe-tiny", "bg");
  fs::path out = make_temp_dir("bg-out");
  CheckpointWriteOptions w;
  w.num_shards = 2;
  write_random_checkpoint(cfg.string(), out.string(), w);
  std::shared_ptr<Model> zero_copy = Model::load(out.string());

  auto load_held = [&](std::promise<void>& go, std::atomic<bool>& held_too_long) {
    ModelLoadOptions o = staged();
    o.upload.background = true;
    std::shared_future<void> released = go.get_future().share();
    o.upload.before_reads = [released, &held_too_long] {
      if (released.wait_for(std::chrono::seconds(20)) != std::future_status::ready) held_too_long = true;
    };
    return std::shared_ptr<Model>(Model::load(out.string(), o));
  };
  {
    std::promise<void> go;
    std::atomic<bool> held_too_long{false};
    std::shared_ptr<Model> m = load_held(go, held_too_long);
    go.set_value();
    m->wait_for_weights();
    EXPECT_FALSE(held_too_long.load()) << "Model::load waited for the reads it should leave running";
    expect_same_weights(*zero_copy, *m);
    m->wait_for_weights();  // again: at once
    expect_finite_forward(*m);
  }
  {
    // The engine's start-up runs while the reads are held (released from another thread once it has
    // begun), and its steps see the whole model.
    std::promise<void> go;
    std::atomic<bool> held_too_long{false};
    std::shared_ptr<Model> m = load_held(go, held_too_long);
    std::thread release([&go] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      go.set_value();
    });
    Engine engine(m, test_engine_config(), nullptr);
    release.join();
    EXPECT_FALSE(held_too_long.load());
    Engine reference(zero_copy, test_engine_config(), nullptr);
    std::vector<EngineRequest> a, b;
    for (const std::vector<int32_t>& prompt :
         {std::vector<int32_t>{3, 17, 42, 5, 9}, std::vector<int32_t>{100, 7}, std::vector<int32_t>{1}}) {
      a.push_back(greedy_request(prompt, 6));
      b.push_back(greedy_request(prompt, 6));
    }
    std::vector<EngineRun> got = run_to_completion(engine, std::move(a));
    std::vector<EngineRun> want = run_to_completion(reference, std::move(b));
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].output.size(), 6u) << i;
      EXPECT_EQ(got[i].output, want[i].output) << "request " << i;
    }
  }
  fs::remove_all(cfg);
  fs::remove_all(out);
}

// A file that loses its end while a background load runs: load() has returned; waiting for the weights,
// every later step and the engine's start-up fail with the error naming the tensor and the file.
TEST(StagedLoad, BackgroundLoadErrorIsThrownByTheWaitAndEveryStep) {
  fs::path cfg = config_dir_of("gpt-oss-tiny", "bgerr");
  fs::path out = make_temp_dir("bgerr-out");
  CheckpointWriteOptions w;
  w.num_shards = 1;
  write_random_checkpoint(cfg.string(), out.string(), w);
  const fs::path file = out / "model.safetensors";
  uint64_t cut = 0;
  {
    Checkpoint ckpt = Checkpoint::open_dir(out.string());
    cut = ckpt.get("model.layers.1.self_attn.q_proj.weight").file_offset + 10;
  }
  ModelLoadOptions o = staged();
  o.upload.background = true;
  o.upload.before_reads = [&] { ASSERT_EQ(::truncate(file.c_str(), static_cast<off_t>(cut)), 0); };
  std::shared_ptr<Model> m = Model::load(out.string(), o);  // the files were whole when it started
  auto expect_load_error = [&](const std::function<void()>& f, const std::string& what) {
    try {
      f();
      ADD_FAILURE() << what << ": no error";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(file.string()), std::string::npos) << what << ": " << msg;
      EXPECT_NE(msg.find("model.layers."), std::string::npos) << what << ": " << msg;
    }
  };
  expect_load_error([&] { m->wait_for_weights(); }, "wait_for_weights");
  expect_load_error([&] { m->wait_for_weights(); }, "wait_for_weights again");
  expect_load_error([&] { expect_finite_forward(*m); }, "a forward pass");
  expect_load_error([&] { Engine engine(m, test_engine_config(), nullptr); }, "the engine's start-up");
  fs::remove_all(cfg);
  fs::remove_all(out);
}

TEST(UploadStaging, HostConversionsAndTransposes) {
  auto be = make_cpu_backend();
  auto staging = be->make_upload_staging(2, 256);
  // A [3, 5] bf16 block, transposed into f32 with a leading dimension of 4.
  std::vector<uint16_t> src(15);
  for (int i = 0; i < 15; ++i) src[i] = f32_to_bf16(static_cast<float>(i) * 0.5f - 3.0f);
  std::memcpy(staging->buffer(0), src.data(), src.size() * 2);
  std::vector<float> t(5 * 4, -99.0f);
  staging->upload(0, {3, 5, DType::kBF16, t.data(), DType::kF32, 4, true});
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 5; ++j) EXPECT_EQ(t[j * 4 + i], bf16_to_f32(src[i * 5 + j])) << i << " " << j;
  for (int j = 0; j < 5; ++j) EXPECT_EQ(t[j * 4 + 3], -99.0f);  // padding untouched
  // f32 rows into bf16 rows of stride 6.
  std::vector<float> f = {1.0f, 1.00390625f, -2.5f, 3.14159f, 0.1f, -0.0f};
  std::memcpy(staging->buffer(1), f.data(), f.size() * 4);
  std::vector<uint16_t> r(2 * 6, 0xffff);
  staging->upload(1, {2, 3, DType::kF32, r.data(), DType::kBF16, 6, false});
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j) EXPECT_EQ(r[i * 6 + j], f32_to_bf16(f[i * 3 + j]));
  EXPECT_EQ(r[3], 0xffff);
  // Unsupported and oversized blocks are invariant failures (CHECK: the process stops).
  EXPECT_DEATH(staging->upload(0, {1, 2, DType::kF32, t.data(), DType::kI32, 2, false}), "not supported");
  EXPECT_DEATH(staging->upload(0, {16, 16, DType::kF32, t.data(), DType::kF32, 16, false}), "does not fit");
}

std::string staged_load_error(const fs::path& dir, const Checkpoint& ckpt) {
  ModelConfig cfg = ModelConfig::from_file((dir / "config.json").string());
  try {
    Model::from_config(cfg, &ckpt, staged(), nullptr);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(StagedLoad, FileTruncatedAfterItsHeaderWasReadNamesTheTensor) {
  fs::path cfg = config_dir_of("gpt-oss-tiny", "trunc");
  fs::path out = make_temp_dir("trunc-out");
  CheckpointWriteOptions o;
  o.num_shards = 1;
  write_random_checkpoint(cfg.string(), out.string(), o);
  const fs::path file = out / "model.safetensors";
  // The header is read (and validated) while the file is whole; then the file loses its end. The staged
  // loader reads with pread, never through the mapping, so this is an error rather than a SIGBUS.
  Checkpoint ckpt = Checkpoint::open_dir(out.string());
  const TensorInfo& victim = ckpt.get("model.layers.1.self_attn.q_proj.weight");
  ASSERT_EQ(::truncate(file.c_str(), static_cast<off_t>(victim.file_offset + 10)), 0);
  std::string err = staged_load_error(out, ckpt);
  EXPECT_NE(err.find("tensor 'model.layers.1.self_attn.q_proj.weight'"), std::string::npos) << err;
  EXPECT_NE(err.find(file.string()), std::string::npos) << err;
  EXPECT_NE(err.find("truncated"), std::string::npos) << err;
  fs::remove_all(cfg);
  fs::remove_all(out);
}

TEST(StagedLoad, ShardRemovedAfterItsHeaderWasReadNamesTheFile) {
  fs::path cfg = config_dir_of("llama-tiny", "gone");
  fs::path out = make_temp_dir("gone-out");
  CheckpointWriteOptions o;
  o.num_shards = 2;
  write_random_checkpoint(cfg.string(), out.string(), o);
  Checkpoint ckpt = Checkpoint::open_dir(out.string());
  const fs::path file = out / "model-00002-of-00002.safetensors";
  fs::remove(file);
  std::string err = staged_load_error(out, ckpt);
  EXPECT_NE(err.find("cannot open checkpoint file " + file.string()), std::string::npos) << err;
  fs::remove_all(cfg);
  fs::remove_all(out);
}

TEST(StagedLoad, HeaderValidationIsUnchanged) {
  // A file already short when opened fails the strict header check, naming the tensor, on every path.
  fs::path cfg = config_dir_of("llama-tiny", "short");
  fs::path out = make_temp_dir("short-out");
  CheckpointWriteOptions o;
  o.num_shards = 1;
  write_random_checkpoint(cfg.string(), out.string(), o);
  const fs::path file = out / "model.safetensors";
  ASSERT_EQ(::truncate(file.c_str(), static_cast<off_t>(fs::file_size(file) - 2)), 0);
  try {
    Model::load(out.string(), staged());
    FAIL() << "loaded a truncated checkpoint";
  } catch (const Error& e) {
    std::string err = e.what();
    EXPECT_NE(err.find("go past the end of the data section"), std::string::npos) << err;
    EXPECT_NE(err.find("tensor '"), std::string::npos) << err;
  }
  fs::remove_all(cfg);
  fs::remove_all(out);
}

}  // namespace
}  // namespace polylora
