// model/decoder.cc: loading and the one forward pass shared by all architectures:
// embedding -> per layer [RMSNorm -> q/k/v (+LoRA) -> (q/k norm) -> RoPE -> paged attention -> o (+LoRA)
// -> residual -> RMSNorm -> dense SwiGLU MLP (+LoRA) or MoE (router, experts, expert LoRA) -> residual]
// -> final RMSNorm on the rows whose logits are wanted -> LM head.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

#include "common/error.h"
#include "common/log.h"
#include "kernels/activation/activation.h"
#include "kernels/embedding/embedding.h"
#include "kernels/linear/linear.h"
#include "kernels/lora/lora.h"
#include "kernels/moe/moe.h"
#include "kernels/norm/rms_norm.h"
#include "kernels/rope/rope.h"
#include "model/arch/arch.h"
#include "model/model.h"

namespace polylora {

namespace k = kernels;

struct Model::Workspace {
  std::vector<float> x, h, q, kk, v, attn, tmp, gate, up, act, logits_in, router, route_w;
  std::vector<int32_t> route_ids, token_slots;
  std::vector<k::ExpertLoraView> expert_lora;
};

std::unique_ptr<Model> Model::load(const std::string& dir, const ModelLoadOptions& options) {
  namespace fs = std::filesystem;
  fs::path root(dir);
  if (!fs::is_directory(root)) fail("model directory {} does not exist", dir);
  ModelConfig cfg = ModelConfig::from_file((root / "config.json").string());
  if (options.load_format == LoadFormat::kDummy) {
    auto m = from_config(cfg, nullptr, options);
    m->source_ = dir + " (dummy weights)";
    return m;
  }
  auto checkpoint = std::make_unique<Checkpoint>(Checkpoint::open_dir(dir));
  auto m = from_config(cfg, checkpoint.get(), options);
  m->weights_.checkpoint = std::move(checkpoint);
  m->source_ = dir;
  return m;
}

std::unique_ptr<Model> Model::from_config(const ModelConfig& config, const Checkpoint* checkpoint,
                                          const ModelLoadOptions& options) {
  std::unique_ptr<Model> m(new Model());
  m->config_ = config;
  WeightLoader loader(checkpoint, m->weights_, options.seed);
  switch (config.arch) {
    case Architecture::kLlama:
    case Architecture::kQwen3: arch::bind_llama(config, loader, m->weights_); break;
    case Architecture::kQwen3Moe: arch::bind_qwen3_moe(config, loader, m->weights_); break;
    case Architecture::kMixtral: arch::bind_mixtral(config, loader, m->weights_); break;
    case Architecture::kGptOss: arch::bind_gpt_oss(config, loader, m->weights_); break;
  }
  loader.finish();
  m->rope_ = RopeTable::from_config(config);
  m->ws_ = std::make_shared<Workspace>();
  return m;
}

namespace {

// Rows of the batch grouped by adapter slot (slots ≥ 0 only).
using SlotRows = std::map<int32_t, std::vector<int32_t>>;

void linear_lora(const LinearWeights& lw, const float* x, int64_t m, int64_t ldx, float* y, int64_t ldy,
                 const SlotRows& groups, std::span<const LoraAdapter* const> adapters, int64_t layer,
                 LoraModule module) {
  k::cpu::linear({.x = x, .m = m, .ldx = ldx, .w = lw.w, .bias = lw.bias_ptr(), .y = y, .ldy = ldy});
  for (const auto& [slot, rows] : groups) {
    const LoraAdapter* a = adapters[static_cast<size_t>(slot)];
    if (!a) continue;
    const auto& mat = a->layers[static_cast<size_t>(layer)].modules[static_cast<size_t>(module)];
    if (!mat) continue;
    k::cpu::lora_apply({.x = x,
                        .ldx = ldx,
                        .y = y,
                        .ldy = ldy,
                        .rows = rows.data(),
                        .num_rows = static_cast<int64_t>(rows.size()),
                        .lora = {mat->a.data(), mat->b.data(), mat->rank, mat->in, mat->out, mat->scale}});
  }
}

k::LoraView view_of(const std::optional<LoraMatrix>& m) {
  if (!m) return {};
  return {m->a.data(), m->b.data(), m->rank, m->in, m->out, m->scale};
}

}  // namespace

void Model::forward(const ForwardBatch& b, std::span<const k::KvCacheView> kv,
                    std::span<const LoraAdapter* const> adapters, float* logits) {
  const ModelConfig& c = config_;
  Workspace& ws = *ws_;
  const int64_t T = b.num_tokens(), H = c.hidden_size, S = b.num_seqs();
  const int64_t qs = c.q_size(), kvs = c.kv_size(), D = c.head_dim;
  CHECK(static_cast<int64_t>(kv.size()) == c.num_layers);
  CHECK(static_cast<int64_t>(b.query_start.size()) == S + 1 && b.query_start[S] == T);
  for (int32_t id : b.token_ids)
    if (id < 0 || id >= c.vocab_size) fail("token id {} is outside the vocabulary (size {})", id, c.vocab_size);

  // Adapter slot per token and rows per slot.
  ws.token_slots.assign(static_cast<size_t>(T), -1);
  SlotRows groups;
  bool any_expert_lora = false;
  for (int64_t s = 0; s < S; ++s) {
    int32_t slot = b.adapter_slots.empty() ? -1 : b.adapter_slots[s];
    if (slot < 0) continue;
    CHECK_MSG(slot < static_cast<int32_t>(adapters.size()), "adapter slot {} out of range", slot);
    const LoraAdapter* a = adapters[static_cast<size_t>(slot)];
    if (!a) continue;
    any_expert_lora |= a->has_expert_lora;
    for (int32_t t = b.query_start[s]; t < b.query_start[s + 1]; ++t) {
      ws.token_slots[t] = slot;
      groups[slot].push_back(t);
    }
  }

  ws.x.resize(static_cast<size_t>(T * H));
  ws.h.resize(static_cast<size_t>(T * H));
  ws.q.resize(static_cast<size_t>(T * qs));
  ws.kk.resize(static_cast<size_t>(T * kvs));
  ws.v.resize(static_cast<size_t>(T * kvs));
  ws.attn.resize(static_cast<size_t>(T * qs));
  ws.tmp.resize(static_cast<size_t>(T * H));
  float* x = ws.x.data();
  float* h = ws.h.data();
  const float eps = static_cast<float>(c.rms_norm_eps);

  k::cpu::embedding({.ids = b.token_ids.data(), .m = T, .table = weights_.embed, .out = x, .ld_out = H});

  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LayerWeights& lw = weights_.layers[l];
    const AttentionWeights& aw = lw.attn;
    k::cpu::rms_norm({.x = x, .ldx = H, .y = h, .ldy = H, .m = T, .n = H, .w = lw.input_norm.data(), .eps = eps});
    linear_lora(aw.q, h, T, H, ws.q.data(), qs, groups, adapters, l, LoraModule::kQ);
    linear_lora(aw.k, h, T, H, ws.kk.data(), kvs, groups, adapters, l, LoraModule::kK);
    linear_lora(aw.v, h, T, H, ws.v.data(), kvs, groups, adapters, l, LoraModule::kV);
    if (c.qk_norm) {
      k::cpu::rms_norm({.x = ws.q.data(), .ldx = D, .y = ws.q.data(), .ldy = D, .m = T * c.num_heads, .n = D,
                        .w = aw.q_norm.data(), .eps = eps});
      k::cpu::rms_norm({.x = ws.kk.data(), .ldx = D, .y = ws.kk.data(), .ldy = D, .m = T * c.num_kv_heads, .n = D,
                        .w = aw.k_norm.data(), .eps = eps});
    }
    k::cpu::rope({.x = ws.q.data(), .ldx = qs, .m = T, .num_heads = c.num_heads, .head_dim = D,
                  .positions = b.positions.data(), .inv_freq = rope_.inv_freq.data(),
                  .attention_scaling = rope_.attention_scaling});
    k::cpu::rope({.x = ws.kk.data(), .ldx = kvs, .m = T, .num_heads = c.num_kv_heads, .head_dim = D,
                  .positions = b.positions.data(), .inv_freq = rope_.inv_freq.data(),
                  .attention_scaling = rope_.attention_scaling});
    k::cpu::write_kv({.k = ws.kk.data(), .ldk = kvs, .v = ws.v.data(), .ldv = kvs, .m = T,
                      .slot_mapping = b.slot_mapping.data(), .cache = kv[l]});
    k::cpu::attention({.q = ws.q.data(),
                       .ldq = qs,
                       .out = ws.attn.data(),
                       .ldo = qs,
                       .num_seqs = S,
                       .query_start = b.query_start.data(),
                       .context_lens = b.context_lens.data(),
                       .block_tables = b.block_tables.data(),
                       .max_blocks_per_seq = b.max_blocks_per_seq,
                       .num_heads = c.num_heads,
                       .scale = 1.0f / std::sqrt(static_cast<float>(D)),
                       .window = c.layer_window(l),
                       .sinks = aw.sinks.empty() ? nullptr : aw.sinks.data(),
                       .cache = kv[l]});
    linear_lora(aw.o, ws.attn.data(), T, qs, ws.tmp.data(), H, groups, adapters, l, LoraModule::kO);
    for (int64_t i = 0; i < T * H; ++i) x[i] += ws.tmp[i];

    k::cpu::rms_norm({.x = x, .ldx = H, .y = h, .ldy = H, .m = T, .n = H, .w = lw.post_attention_norm.data(),
                      .eps = eps});
    if (!lw.is_moe) {
      int64_t I = c.intermediate_size;
      ws.gate.resize(static_cast<size_t>(T * I));
      ws.up.resize(static_cast<size_t>(T * I));
      ws.act.resize(static_cast<size_t>(T * I));
      linear_lora(lw.mlp.gate, h, T, H, ws.gate.data(), I, groups, adapters, l, LoraModule::kGate);
      linear_lora(lw.mlp.up, h, T, H, ws.up.data(), I, groups, adapters, l, LoraModule::kUp);
      k::cpu::silu_and_mul({.gate = ws.gate.data(), .ld_gate = I, .up = ws.up.data(), .ld_up = I,
                            .out = ws.act.data(), .ld_out = I, .m = T, .n = I});
      linear_lora(lw.mlp.down, ws.act.data(), T, I, ws.tmp.data(), H, groups, adapters, l, LoraModule::kDown);
    } else {
      int64_t E = c.num_experts, K = c.num_experts_per_tok;
      ws.router.resize(static_cast<size_t>(T * E));
      ws.route_ids.resize(static_cast<size_t>(T * K));
      ws.route_w.resize(static_cast<size_t>(T * K));
      k::cpu::linear({.x = h, .m = T, .ldx = H, .w = lw.moe.router.w, .bias = lw.moe.router.bias_ptr(),
                      .y = ws.router.data(), .ldy = E});
      k::cpu::route({.logits = ws.router.data(),
                     .m = T,
                     .num_experts = E,
                     .top_k = K,
                     .scoring = c.router == RouterKind::kTopKSoftmax ? k::RouterScoring::kTopKSoftmax
                                                                     : k::RouterScoring::kSoftmaxTopK,
                     .renormalize = c.norm_topk_prob,
                     .ids = ws.route_ids.data(),
                     .weights = ws.route_w.data()});
      // Expert LoRA table: [slot, expert] views for this layer.
      int64_t num_slots = static_cast<int64_t>(adapters.size());
      bool layer_lora = false;
      if (any_expert_lora) {
        ws.expert_lora.assign(static_cast<size_t>(num_slots * E), {});
        for (int64_t s = 0; s < num_slots; ++s) {
          const LoraAdapter* a = adapters[static_cast<size_t>(s)];
          if (!a) continue;
          const auto& experts = a->layers[static_cast<size_t>(l)].experts;
          for (int64_t e = 0; e < static_cast<int64_t>(experts.size()); ++e) {
            const LoraExpert& le = experts[static_cast<size_t>(e)];
            ws.expert_lora[s * E + e] = {view_of(le.gate_up), view_of(le.gate), view_of(le.up), view_of(le.down)};
            layer_lora = true;
          }
        }
      }
      k::cpu::moe_experts({.x = h,
                           .ldx = H,
                           .m = T,
                           .hidden = H,
                           .inter = c.moe_intermediate_size,
                           .num_experts = E,
                           .top_k = K,
                           .ids = ws.route_ids.data(),
                           .weights = ws.route_w.data(),
                           .experts = lw.moe.experts.data(),
                           .act = c.expert_activation == ExpertActivation::kGptOssClampedSwiglu
                                      ? k::ExpertAct::kGptOssSwiglu
                                      : k::ExpertAct::kSiluGate,
                           .swiglu_alpha = static_cast<float>(c.swiglu_alpha),
                           .swiglu_limit = static_cast<float>(c.swiglu_limit),
                           .token_slots = layer_lora ? ws.token_slots.data() : nullptr,
                           .lora = layer_lora ? ws.expert_lora.data() : nullptr,
                           .num_slots = layer_lora ? num_slots : 0,
                           .out = ws.tmp.data(),
                           .ldo = H});
    }
    for (int64_t i = 0; i < T * H; ++i) x[i] += ws.tmp[i];
  }

  // Final norm and LM head on the wanted rows only.
  int64_t R = static_cast<int64_t>(b.logits_rows.size());
  ws.logits_in.resize(static_cast<size_t>(R * H));
  for (int64_t r = 0; r < R; ++r) {
    int32_t row = b.logits_rows[r];
    CHECK(row >= 0 && row < T);
    k::cpu::rms_norm({.x = x + row * H, .ldx = H, .y = ws.logits_in.data() + r * H, .ldy = H, .m = 1, .n = H,
                      .w = weights_.final_norm.data(), .eps = eps});
  }
  k::cpu::linear({.x = ws.logits_in.data(), .m = R, .ldx = H, .w = weights_.lm_head, .bias = nullptr, .y = logits,
                  .ldy = c.vocab_size});
}

}  // namespace polylora
