// tests/unit/model/copy_weights_test.cc: copy_weights (model/tp_shard.h), which puts a tensor-parallel rank's
// shard on its GPU, walked here onto a second CPU backend: for every fixture architecture (dense, MoE with
// separate and fused gate/up, GPT-OSS's biases and sinks, MXFP4 experts, INT8 weights) and every rank of a
// 2-way split, each matrix, vector and expert of the copy holds the shard's values, none is left out, and the
// MXFP4 and INT8 copies and the vectors (real copies on every backend) are in new memory. Also: dummy weights
// made for one rank (RankDummyWeights).
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

// Calls matrix(a, b, what, is_router) and vector(a, b, n, what) on every pair of corresponding views of
// two rank shards of one model (`local`: the rank's config, for the vectors' lengths), and checks that
// their layers, kinds and experts correspond and that each copy's device array of expert views is its own.
template <typename MatrixFn, typename VectorFn>
void walk_pairs(const ModelWeights& a, const ModelWeights& b, const ModelConfig& local, const std::string& at,
                const MatrixFn& matrix, const VectorFn& vector) {
  auto linear = [&](const LinearWeights& x, const LinearWeights& y, const std::string& what, bool router) {
    matrix(x.w, y.w, what, router);
    vector(x.bias, y.bias, x.w.rows, what + ".bias");
  };
  const int64_t H = local.hidden_size;
  matrix(a.embed, b.embed, at + " embed", false);
  matrix(a.lm_head, b.lm_head, at + " lm_head", false);
  EXPECT_EQ(a.lm_head.data == a.embed.data, b.lm_head.data == b.embed.data) << at << " tying";
  vector(a.final_norm, b.final_norm, H, at + " final_norm");
  ASSERT_EQ(a.layers.size(), b.layers.size()) << at;
  for (size_t l = 0; l < a.layers.size(); ++l) {
    const LayerWeights &x = a.layers[l], &y = b.layers[l];
    const std::string L = at + " layer " + std::to_string(l);
    vector(x.input_norm, y.input_norm, H, L + " input_norm");
    vector(x.post_attention_norm, y.post_attention_norm, H, L + " post_norm");
    linear(x.attn.q, y.attn.q, L + " q", false);
    linear(x.attn.k, y.attn.k, L + " k", false);
    linear(x.attn.v, y.attn.v, L + " v", false);
    linear(x.attn.o, y.attn.o, L + " o", false);
    vector(x.attn.q_norm, y.attn.q_norm, local.head_dim, L + " q_norm");
    vector(x.attn.k_norm, y.attn.k_norm, local.head_dim, L + " k_norm");
    vector(x.attn.sinks, y.attn.sinks, local.num_heads, L + " sinks");
    ASSERT_EQ(x.is_moe, y.is_moe) << L;
    if (!x.is_moe) {
      linear(x.mlp.gate, y.mlp.gate, L + " gate", false);
      linear(x.mlp.up, y.mlp.up, L + " up", false);
      linear(x.mlp.down, y.mlp.down, L + " down", false);
      continue;
    }
    linear(x.moe.router, y.moe.router, L + " router", true);
    ASSERT_EQ(x.moe.experts.size(), y.moe.experts.size()) << L;
    ASSERT_NE(y.moe.experts_on_device, nullptr) << L;
    for (size_t e = 0; e < x.moe.experts.size(); ++e) {
      const k::ExpertView &p = x.moe.experts[e], &q = y.moe.experts[e];
      const std::string E = L + " expert " + std::to_string(e);
      matrix(p.gate_up, q.gate_up, E + " gate_up", false);
      matrix(p.gate, q.gate, E + " gate", false);
      matrix(p.up, q.up, E + " up", false);
      matrix(p.down, q.down, E + " down", false);
      vector(p.gate_up_bias, q.gate_up_bias, p.gate_up.rows, E + " gate_up_bias");
      vector(p.down_bias, q.down_bias, H, E + " down_bias");
      EXPECT_EQ(y.moe.experts_on_device[e].down.data, q.down.data)
          << E << ": the device array is not its own";
      EXPECT_EQ(y.moe.experts_on_device[e].down_bias, q.down_bias) << E;
    }
  }
}

// The same values (row by row), and MXFP4 / INT8 matrices and every vector in new memory.
void expect_same_values(const k::WeightView& a, const k::WeightView& b, const std::string& what, bool) {
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
    walk_pairs(shard, copy, local, model + " rank " + std::to_string(r), expect_same_values,
               expect_same_vector);
    EXPECT_GT(copy.num_bytes, 0u) << model;
  }
}

TEST(CopyWeights, EveryArchitectureAndRank) {
  for (const std::string model :
       {"llama-tiny", "qwen3-moe-tiny", "gpt-oss-tiny", "mixtral-tiny", "gpt-oss-mxfp4-tiny"})
    check_copy(model, WeightQuantization::kNone);
}

TEST(CopyWeights, Int8Weights) {
  for (const std::string model : {"llama-tiny", "qwen3-moe-tiny"})
    check_copy(model, WeightQuantization::kInt8);
}

// Dummy weights made for a rank's own config on its GPU (tensor parallelism with --load-format dummy:
// arch::bind on shard_config, then trim_rank_weights) have the shapes, dtypes and biases of the same rank's
// share of the whole model (shard_weights), here on CPU backends, for every fixture architecture at -tp 2 and
// -tp 4 (KV heads replicated), also with expert parallelism (whole experts per rank; the router over all of
// them, in f32, the same on every rank).
ModelWeights dummy_rank(const ModelConfig& cfg, const TpShard& s, Backend& be) {
  ModelWeights made;
  WeightLoader loader(nullptr, be, made, 7);
  arch::bind(shard_config(cfg, s), loader, made);
  loader.finish();
  trim_rank_weights(made, cfg, s, be, 7);
  return made;
}

TEST(RankDummyWeights, ShapesEqualTheSplitModel) {
  for (const std::string model :
       {"llama-tiny", "qwen3-moe-tiny", "gpt-oss-tiny", "mixtral-tiny", "gpt-oss-mxfp4-tiny"})
    for (auto [n, ep] : {std::pair{2, false}, {4, false}, {2, true}, {4, true}}) {
      if (ep && model == "llama-tiny") continue;
      const ModelConfig cfg =
          ModelConfig::from_file(testing_util::data_dir() + "/models/" + model + "/config.json");
      ModelLoadOptions o;
      o.load_format = LoadFormat::kDummy;
      auto whole = Model::from_config(cfg, nullptr, o, nullptr);
      std::unique_ptr<Backend> first_be = make_cpu_backend();
      const ModelWeights first =
          dummy_rank(cfg, make_tp_shard(cfg, 0, {.size = n, .expert_parallel = ep}), *first_be);
      for (int r = 0; r < n; ++r) {
        const TpShard s = make_tp_shard(cfg, r, {.size = n, .expert_parallel = ep});
        std::unique_ptr<Backend> a = make_cpu_backend(), b = make_cpu_backend();
        const ModelWeights split = shard_weights(whole->weights(), cfg, s, *a);
        const ModelWeights made = dummy_rank(cfg, s, *b);
        const std::string at =
            model + " -tp " + std::to_string(n) + (ep ? " -ep" : "") + " rank " + std::to_string(r);
        auto same_shape = [&](const k::WeightView& x, const k::WeightView& y, const std::string& what,
                              bool router) {
          EXPECT_EQ(x.empty(), y.empty()) << what;
          EXPECT_EQ(x.rows, y.rows) << what;
          EXPECT_EQ(x.cols, y.cols) << what;
          // With -ep the router is made again for all experts in f32 (the GPU loader's router dtype).
          EXPECT_EQ(router && ep ? DType::kF32 : x.dtype, y.dtype) << what;
        };
        auto same_presence = [](const float* x, const float* y, int64_t, const std::string& what) {
          EXPECT_EQ(x == nullptr, y == nullptr) << what;
        };
        walk_pairs(split, made, shard_config(cfg, s), at, same_shape, same_presence);
        if (!ep || r == 0) continue;
        // The same router values on every rank (rank 0's).
        for (size_t l = 0; l < made.layers.size(); ++l) {
          if (!made.layers[l].is_moe) continue;
          std::vector<float> r0(static_cast<size_t>(cfg.hidden_size)), rr(r0.size());
          first.layers[l].moe.router.w.row_to_f32(cfg.num_experts - 1, r0.data());
          made.layers[l].moe.router.w.row_to_f32(cfg.num_experts - 1, rr.data());
          EXPECT_EQ(r0, rr) << at << " layer " << l << " router";
        }
      }
    }
}

}  // namespace
}  // namespace polylora
