// tests/unit/model/copy_weights_test.cc: copy_weights (model/tp_shard.h), which puts a tensor-parallel rank's
// shard on its GPU, walked here onto a second CPU backend: for every fixture architecture (dense, MoE with
// separate and fused gate/up, GPT-OSS's biases and sinks, MXFP4 experts, INT8 weights) and every rank of a
// 2-way split, each matrix, vector and expert of the copy holds the shard's values, none is left out, the
// routers stay f32, and the MXFP4 and INT8 copies (real copies on every backend) are in new memory.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model/arch/arch.h"
#include "model/model.h"
#include "model/tp_shard.h"
#include "unit/test_util.h"

namespace polylora {
namespace {

namespace k = kernels;

void expect_same_matrix(const k::WeightView& a, const k::WeightView& b, const std::string& what) {
  ASSERT_EQ(a.empty(), b.empty()) << what;
  if (a.empty()) return;
  ASSERT_EQ(a.rows, b.rows) << what;
  ASSERT_EQ(a.cols, b.cols) << what;
  ASSERT_EQ(a.dtype, b.dtype) << what;
  if (a.mxfp4() || a.int8()) EXPECT_NE(a.data, b.data) << what << ": not copied";
  std::vector<float> ra(static_cast<size_t>(a.cols)), rb(ra.size());
  for (int64_t r = 0; r < a.rows; ++r) {
    a.row_to_f32(r, ra.data());
    b.row_to_f32(r, rb.data());
    ASSERT_EQ(ra, rb) << what << " row " << r;
  }
}

void expect_same_vector(const float* a, const float* b, int64_t n, const std::string& what) {
  ASSERT_EQ(a == nullptr, b == nullptr) << what;
  if (!a) return;
  EXPECT_NE(a, b) << what << ": not copied";
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(a[i], b[i]) << what << " [" << i << "]";
}

void expect_same_linear(const LinearWeights& a, const LinearWeights& b, const std::string& what) {
  expect_same_matrix(a.w, b.w, what);
  expect_same_vector(a.bias, b.bias, a.w.rows, what + ".bias");
}

void check_copy(const std::string& model, WeightQuantization q) {
  ModelLoadOptions o;
  o.quantization = q;
  auto m = Model::load(testing_util::data_dir() + "/models/" + model, o);
  const ModelConfig& cfg = m->config();
  for (int r = 0; r < 2; ++r) {
    const TpShard s = make_tp_shard(cfg, r, {.size = 2});
    const ModelConfig local = shard_config(cfg, s);
    std::unique_ptr<Backend> scratch = make_cpu_backend(), target = make_cpu_backend();
    const ModelWeights shard = shard_weights(m->weights(), cfg, s, *scratch);
    const ModelWeights copy = copy_weights(shard, local, *target);
    const std::string at = model + " rank " + std::to_string(r);
    expect_same_matrix(shard.embed, copy.embed, at + " embed");
    expect_same_matrix(shard.lm_head, copy.lm_head, at + " lm_head");
    EXPECT_EQ(shard.lm_head.data == shard.embed.data, copy.lm_head.data == copy.embed.data) << at << " tying";
    expect_same_vector(shard.final_norm, copy.final_norm, local.hidden_size, at + " final_norm");
    ASSERT_EQ(shard.layers.size(), copy.layers.size());
    for (size_t l = 0; l < shard.layers.size(); ++l) {
      const LayerWeights &a = shard.layers[l], &b = copy.layers[l];
      const std::string L = at + " layer " + std::to_string(l);
      expect_same_vector(a.input_norm, b.input_norm, local.hidden_size, L + " input_norm");
      expect_same_vector(a.post_attention_norm, b.post_attention_norm, local.hidden_size, L + " post_norm");
      expect_same_linear(a.attn.q, b.attn.q, L + " q");
      expect_same_linear(a.attn.k, b.attn.k, L + " k");
      expect_same_linear(a.attn.v, b.attn.v, L + " v");
      expect_same_linear(a.attn.o, b.attn.o, L + " o");
      expect_same_vector(a.attn.q_norm, b.attn.q_norm, local.head_dim, L + " q_norm");
      expect_same_vector(a.attn.k_norm, b.attn.k_norm, local.head_dim, L + " k_norm");
      expect_same_vector(a.attn.sinks, b.attn.sinks, local.num_heads, L + " sinks");
      ASSERT_EQ(a.is_moe, b.is_moe) << L;
      if (!a.is_moe) {
        expect_same_linear(a.mlp.gate, b.mlp.gate, L + " gate");
        expect_same_linear(a.mlp.up, b.mlp.up, L + " up");
        expect_same_linear(a.mlp.down, b.mlp.down, L + " down");
        continue;
      }
      expect_same_linear(a.moe.router, b.moe.router, L + " router");
      ASSERT_EQ(a.moe.experts.size(), b.moe.experts.size()) << L;
      ASSERT_NE(b.moe.experts_on_device, nullptr) << L;
      for (size_t e = 0; e < a.moe.experts.size(); ++e) {
        const k::ExpertView &x = a.moe.experts[e], &y = b.moe.experts[e];
        const std::string E = L + " expert " + std::to_string(e);
        expect_same_matrix(x.gate_up, y.gate_up, E + " gate_up");
        expect_same_matrix(x.gate, y.gate, E + " gate");
        expect_same_matrix(x.up, y.up, E + " up");
        expect_same_matrix(x.down, y.down, E + " down");
        expect_same_vector(x.gate_up_bias, y.gate_up_bias, x.gate_up.rows, E + " gate_up_bias");
        expect_same_vector(x.down_bias, y.down_bias, local.hidden_size, E + " down_bias");
        // The device array of expert views is the copy's.
        EXPECT_EQ(b.moe.experts_on_device[e].down.data, y.down.data) << E;
      }
    }
    EXPECT_GT(copy.num_bytes, 0u) << at;
  }
}

TEST(CopyWeights, EveryArchitectureAndRank) {
  for (const std::string model : {"llama-tiny", "qwen3-moe-tiny", "gpt-oss-tiny", "mixtral-tiny",
                                  "gpt-oss-mxfp4-tiny"})
    check_copy(model, WeightQuantization::kNone);
}

TEST(CopyWeights, Int8Weights) {
  for (const std::string model : {"llama-tiny", "qwen3-moe-tiny"}) check_copy(model, WeightQuantization::kInt8);
}

// Dummy weights made for a rank's own config on its GPU (tensor parallelism with --load-format dummy:
// arch::bind on shard_config, then trim_rank_weights) have the shapes, dtypes and biases of the same rank's
// share of the whole model (shard_weights), here on CPU backends, for every fixture architecture at -tp 2 and
// -tp 4 (KV heads replicated), also with expert parallelism (whole experts per rank; the router over all of
// them, the same on every rank).
void expect_same_shape(const k::WeightView& a, const k::WeightView& b, const std::string& what) {
  EXPECT_EQ(a.empty(), b.empty()) << what;
  EXPECT_EQ(a.rows, b.rows) << what;
  EXPECT_EQ(a.cols, b.cols) << what;
  EXPECT_EQ(a.dtype, b.dtype) << what;
}
void expect_same_linear_shape(const LinearWeights& a, const LinearWeights& b, const std::string& what) {
  expect_same_shape(a.w, b.w, what);
  EXPECT_EQ(a.bias == nullptr, b.bias == nullptr) << what << ".bias";
}

TEST(RankDummyWeights, ShapesEqualTheSplitModel) {
  for (const std::string model : {"llama-tiny", "qwen3-moe-tiny", "gpt-oss-tiny", "mixtral-tiny",
                                  "gpt-oss-mxfp4-tiny"})
    for (auto [n, ep] : {std::pair{2, false}, {4, false}, {2, true}, {4, true}}) {
      if (ep && model == "llama-tiny") continue;
      const ModelConfig cfg =
          ModelConfig::from_file(testing_util::data_dir() + "/models/" + model + "/config.json");
      ModelLoadOptions o;
      o.load_format = LoadFormat::kDummy;
      auto whole = Model::from_config(cfg, nullptr, o, nullptr);
      for (int r = 0; r < n; ++r) {
        const TpShard s = make_tp_shard(cfg, r, {.size = n, .expert_parallel = ep});
        const ModelConfig local = shard_config(cfg, s);
        std::unique_ptr<Backend> a = make_cpu_backend(), b = make_cpu_backend();
        const ModelWeights split = shard_weights(whole->weights(), cfg, s, *a);
        ModelWeights made;
        WeightLoader loader(nullptr, *b, made, 7);
        arch::bind(local, loader, made);
        loader.finish();
        trim_rank_weights(made, cfg, s, *b, 7);
        const std::string at =
            model + " -tp " + std::to_string(n) + (ep ? " -ep" : "") + " rank " + std::to_string(r);
        expect_same_shape(split.embed, made.embed, at + " embed");
        expect_same_shape(split.lm_head, made.lm_head, at + " lm_head");
        ASSERT_EQ(split.layers.size(), made.layers.size()) << at;
        for (size_t l = 0; l < split.layers.size(); ++l) {
          const LayerWeights &x = split.layers[l], &y = made.layers[l];
          const std::string L = at + " layer " + std::to_string(l);
          expect_same_linear_shape(x.attn.q, y.attn.q, L + " q");
          expect_same_linear_shape(x.attn.k, y.attn.k, L + " k");
          expect_same_linear_shape(x.attn.v, y.attn.v, L + " v");
          expect_same_linear_shape(x.attn.o, y.attn.o, L + " o");
          EXPECT_EQ(x.attn.sinks == nullptr, y.attn.sinks == nullptr) << L;
          ASSERT_EQ(x.is_moe, y.is_moe) << L;
          if (!x.is_moe) {
            expect_same_linear_shape(x.mlp.gate, y.mlp.gate, L + " gate");
            expect_same_linear_shape(x.mlp.up, y.mlp.up, L + " up");
            expect_same_linear_shape(x.mlp.down, y.mlp.down, L + " down");
            continue;
          }
          if (!ep) {
            expect_same_linear_shape(x.moe.router, y.moe.router, L + " router");
          } else {  // made again for all experts, in f32 (the GPU loader's router dtype) on every backend
            EXPECT_EQ(x.moe.router.w.rows, y.moe.router.w.rows) << L << " router";
            EXPECT_EQ(x.moe.router.w.cols, y.moe.router.w.cols) << L << " router";
            EXPECT_EQ(y.moe.router.w.dtype, DType::kF32) << L << " router";
            EXPECT_EQ(x.moe.router.bias == nullptr, y.moe.router.bias == nullptr) << L << " router bias";
          }
          if (ep && r > 0) {  // the same router values as rank 0's
            ModelWeights first;
            std::unique_ptr<Backend> c = make_cpu_backend();
            WeightLoader l0(nullptr, *c, first, 7);
            arch::bind(shard_config(cfg, make_tp_shard(cfg, 0, {.size = n, .expert_parallel = true})), l0, first);
            l0.finish();
            trim_rank_weights(first, cfg, make_tp_shard(cfg, 0, {.size = n, .expert_parallel = true}), *c, 7);
            std::vector<float> r0(static_cast<size_t>(cfg.hidden_size)), rr(r0.size());
            first.layers[l].moe.router.w.row_to_f32(cfg.num_experts - 1, r0.data());
            y.moe.router.w.row_to_f32(cfg.num_experts - 1, rr.data());
            EXPECT_EQ(r0, rr) << L << " router";
          }
          ASSERT_EQ(x.moe.experts.size(), y.moe.experts.size()) << L;
          for (size_t e = 0; e < x.moe.experts.size(); ++e) {
            const k::ExpertView &p = x.moe.experts[e], &q = y.moe.experts[e];
            const std::string E = L + " expert " + std::to_string(e);
            expect_same_shape(p.gate_up, q.gate_up, E + " gate_up");
            expect_same_shape(p.gate, q.gate, E + " gate");
            expect_same_shape(p.up, q.up, E + " up");
            expect_same_shape(p.down, q.down, E + " down");
            EXPECT_EQ(p.gate_up_bias == nullptr, q.gate_up_bias == nullptr) << E;
            EXPECT_EQ(p.down_bias == nullptr, q.down_bias == nullptr) << E;
            EXPECT_EQ(made.layers[l].moe.experts_on_device[e].down_bias, q.down_bias) << E;
          }
        }
      }
    }
}

}  // namespace
}  // namespace polylora
