// model/decoder.cc: loading and the one forward pass shared by all architectures and backends:
// embedding -> per layer [RMSNorm -> q/k/v (+LoRA) -> (q/k norm) -> RoPE -> paged attention -> o (+LoRA)
// -> residual -> RMSNorm -> dense SwiGLU MLP (+LoRA) or MoE (router, experts, expert LoRA) -> residual]
// -> final RMSNorm on the rows whose logits are wanted -> LM head.
// A step's inputs (ids, positions, block tables, slots, adapter rows and expert-LoRA tables) are packed
// on the host and copied to the backend once per forward; nothing is read back until the logits.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>

#include "common/error.h"
#include "common/log.h"
#include "model/arch/arch.h"
#include "model/model.h"

namespace polylora {

namespace k = kernels;

struct Model::DeviceAdapter {
  struct Layer {
    std::array<k::LoraView, kNumLoraModules> modules{};
    std::vector<k::ExpertLoraView> experts;  // [E] or empty
  };
  std::vector<Layer> layers;
  std::vector<void*> allocations;
};

namespace {
struct Buffer {
  void* ptr = nullptr;
  size_t cap = 0;
};
}  // namespace

struct Model::Workspace {
  Buffer x, h, q, kk, v, attn, tmp, gate, up, act, router, route_w, route_ids, logits_in, logits, inputs;
  std::vector<std::byte> staging;
};

namespace {

// Grows `b` to at least `bytes` (contents are not kept) and returns it.
template <typename T>
T* ensure(Backend& be, Buffer& b, size_t count) {
  size_t bytes = count * sizeof(T);
  if (b.cap < bytes) {
    if (b.ptr) be.free(b.ptr);
    b.cap = std::max(bytes, b.cap + b.cap / 2);
    b.ptr = be.alloc(b.cap);
  }
  return static_cast<T*>(b.ptr);
}

// Host staging of the step's inputs: append arrays at 256-byte aligned offsets, then one copy.
class Staging {
 public:
  explicit Staging(std::vector<std::byte>& buf) : buf_(buf) { buf_.clear(); }
  template <typename T>
  size_t add(const T* data, size_t n) {
    size_t off = (buf_.size() + 255) / 256 * 256;
    buf_.resize(off + n * sizeof(T));
    if (n) std::memcpy(buf_.data() + off, data, n * sizeof(T));
    return off;
  }
  template <typename T>
  size_t add(const std::vector<T>& v) {
    return add(v.data(), v.size());
  }
  size_t size() const { return buf_.size(); }
  const std::byte* data() const { return buf_.data(); }

 private:
  std::vector<std::byte>& buf_;
};

}  // namespace

std::unique_ptr<Model> Model::load(const std::string& dir, const ModelLoadOptions& options,
                                   std::shared_ptr<Backend> backend) {
  namespace fs = std::filesystem;
  fs::path root(dir);
  if (!fs::is_directory(root)) fail("model directory {} does not exist", dir);
  ModelConfig cfg = ModelConfig::from_file((root / "config.json").string());
  if (options.load_format == LoadFormat::kDummy) {
    auto m = from_config(cfg, nullptr, options, std::move(backend));
    m->source_ = dir + " (dummy weights)";
    return m;
  }
  auto checkpoint = std::make_unique<Checkpoint>(Checkpoint::open_dir(dir));
  auto m = from_config(cfg, checkpoint.get(), options, std::move(backend));
  if (m->backend_->kind() == DeviceKind::kCpu)
    m->weights_.checkpoint = std::move(checkpoint);  // views point into it
  m->source_ = dir;
  return m;
}

std::unique_ptr<Model> Model::from_config(const ModelConfig& config, const Checkpoint* checkpoint,
                                          const ModelLoadOptions& options, std::shared_ptr<Backend> backend) {
  std::unique_ptr<Model> m(new Model());
  m->config_ = config;
  m->backend_ = backend ? std::move(backend) : std::shared_ptr<Backend>(make_cpu_backend());
  WeightLoader loader(checkpoint, *m->backend_, m->weights_, options.seed);
  switch (config.arch) {
    case Architecture::kLlama:
    case Architecture::kQwen3:
      arch::bind_llama(config, loader, m->weights_);
      break;
    case Architecture::kQwen3Moe:
      arch::bind_qwen3_moe(config, loader, m->weights_);
      break;
    case Architecture::kMixtral:
      arch::bind_mixtral(config, loader, m->weights_);
      break;
    case Architecture::kGptOss:
      arch::bind_gpt_oss(config, loader, m->weights_);
      break;
  }
  loader.finish();
  m->rope_ = RopeTable::from_config(config);
  m->inv_freq_ = m->backend_->vector_from_host(m->rope_.inv_freq.data(), m->rope_.inv_freq.size());
  m->ws_ = std::make_unique<Workspace>();
  m->backend_->synchronize();
  return m;
}

Model::~Model() {
  if (!backend_) return;
  for (auto& [gen, da] : adapters_)
    for (void* p : da->allocations) backend_->free(p);
}

void Model::release_adapter(uint64_t generation) {
  auto it = adapters_.find(generation);
  if (it == adapters_.end()) return;
  backend_->synchronize();
  for (void* p : it->second->allocations) backend_->free(p);
  adapters_.erase(it);
}

const Model::DeviceAdapter& Model::device_adapter(const LoraAdapter& adapter) {
  auto it = adapters_.find(adapter.generation);
  if (it != adapters_.end()) return *it->second;
  auto da = std::make_unique<DeviceAdapter>();
  bool host = backend_->kind() == DeviceKind::kCpu;
  auto place = [&](const std::optional<LoraMatrix>& m) -> k::LoraView {
    if (!m) return {};
    const float* a = m->a.data();
    const float* b = m->b.data();
    if (!host) {
      void* da_ptr = backend_->alloc(m->a.size() * 4);
      void* db_ptr = backend_->alloc(m->b.size() * 4);
      backend_->copy_to_device(da_ptr, m->a.data(), m->a.size() * 4);
      backend_->copy_to_device(db_ptr, m->b.data(), m->b.size() * 4);
      da->allocations.push_back(da_ptr);
      da->allocations.push_back(db_ptr);
      a = static_cast<const float*>(da_ptr);
      b = static_cast<const float*>(db_ptr);
    }
    return {a, b, m->rank, m->in, m->out, m->scale};
  };
  da->layers.resize(adapter.layers.size());
  for (size_t l = 0; l < adapter.layers.size(); ++l) {
    const LoraLayer& src = adapter.layers[l];
    for (size_t mod = 0; mod < kNumLoraModules; ++mod) da->layers[l].modules[mod] = place(src.modules[mod]);
    for (const LoraExpert& e : src.experts)
      da->layers[l].experts.push_back({place(e.gate_up), place(e.gate), place(e.up), place(e.down)});
  }
  return *adapters_.emplace(adapter.generation, std::move(da)).first->second;
}

void Model::forward(const ForwardBatch& b, std::span<const k::KvCacheView> kv,
                    std::span<const LoraAdapter* const> adapters, float* logits) {
  const ModelConfig& c = config_;
  Backend& be = *backend_;
  Workspace& ws = *ws_;
  const int64_t T = b.num_tokens(), H = c.hidden_size, S = b.num_seqs();
  const int64_t qs = c.q_size(), kvs = c.kv_size(), D = c.head_dim;
  const int64_t E = c.num_experts, K = c.num_experts_per_tok;
  const int64_t R = static_cast<int64_t>(b.logits_rows.size());
  CHECK(static_cast<int64_t>(kv.size()) == c.num_layers);
  CHECK(static_cast<int64_t>(b.query_start.size()) == S + 1 && b.query_start[S] == T);
  CHECK(static_cast<int64_t>(b.positions.size()) == T && static_cast<int64_t>(b.slot_mapping.size()) == T);
  CHECK(static_cast<int64_t>(b.block_tables.size()) == S * b.max_blocks_per_seq);
  for (int32_t id : b.token_ids)
    if (id < 0 || id >= c.vocab_size)
      fail("token id {} is outside the vocabulary (size {})", id, c.vocab_size);
  for (int32_t row : b.logits_rows) CHECK(row >= 0 && row < T);
  if (T == 0) return;

  // Adapters of this step: rows per slot (dense LoRA) and per-token slots (expert LoRA).
  const int64_t num_slots = static_cast<int64_t>(adapters.size());
  std::vector<int32_t> token_slots(static_cast<size_t>(T), -1);
  std::map<int32_t, std::vector<int32_t>> slot_rows;
  std::vector<const DeviceAdapter*> dev(static_cast<size_t>(num_slots), nullptr);
  bool any_expert_lora = false;
  for (int64_t s = 0; s < S; ++s) {
    int32_t slot = b.adapter_slots.empty() ? -1 : b.adapter_slots[s];
    if (slot < 0) continue;
    CHECK_MSG(slot < num_slots, "adapter slot {} out of range", slot);
    const LoraAdapter* a = adapters[static_cast<size_t>(slot)];
    if (!a) continue;
    if (!dev[slot]) dev[slot] = &device_adapter(*a);
    any_expert_lora |= a->has_expert_lora;
    for (int32_t t = b.query_start[s]; t < b.query_start[s + 1]; ++t) {
      token_slots[t] = slot;
      slot_rows[slot].push_back(t);
    }
  }

  // Pack every step input into one host buffer and copy it once.
  Staging st(ws.staging);
  size_t o_ids = st.add(b.token_ids), o_pos = st.add(b.positions), o_qs = st.add(b.query_start),
         o_ctx = st.add(b.context_lens), o_bt = st.add(b.block_tables), o_slot = st.add(b.slot_mapping),
         o_rows = st.add(b.logits_rows), o_tslots = st.add(token_slots);
  std::map<int32_t, size_t> o_slot_rows;
  for (const auto& [slot, rows] : slot_rows) o_slot_rows[slot] = st.add(rows);
  std::vector<size_t> o_expert_lora(static_cast<size_t>(c.num_layers), SIZE_MAX);
  if (any_expert_lora) {
    std::vector<k::ExpertLoraView> table;
    for (int64_t l = 0; l < c.num_layers; ++l) {
      if (!c.moe_layers[l]) continue;
      table.assign(static_cast<size_t>(num_slots * E), {});
      bool used = false;
      for (int64_t s = 0; s < num_slots; ++s) {
        if (!dev[s]) continue;
        const auto& experts = dev[s]->layers[static_cast<size_t>(l)].experts;
        for (size_t e = 0; e < experts.size(); ++e) table[s * E + e] = experts[e];
        used |= !experts.empty();
      }
      if (used) o_expert_lora[l] = st.add(table);
    }
  }
  auto* inputs = ensure<std::byte>(be, ws.inputs, st.size());
  be.copy_to_device(inputs, st.data(), st.size());
  auto at = [&](size_t off) { return inputs + off; };
  const auto* d_ids = reinterpret_cast<const int32_t*>(at(o_ids));
  const auto* d_pos = reinterpret_cast<const int32_t*>(at(o_pos));
  const auto* d_qs = reinterpret_cast<const int32_t*>(at(o_qs));
  const auto* d_ctx = reinterpret_cast<const int32_t*>(at(o_ctx));
  const auto* d_bt = reinterpret_cast<const int32_t*>(at(o_bt));
  const auto* d_slot = reinterpret_cast<const int64_t*>(at(o_slot));
  const auto* d_rows = reinterpret_cast<const int32_t*>(at(o_rows));
  const auto* d_tslots = reinterpret_cast<const int32_t*>(at(o_tslots));

  float* x = ensure<float>(be, ws.x, T * H);
  float* h = ensure<float>(be, ws.h, T * H);
  float* q = ensure<float>(be, ws.q, T * qs);
  float* kk = ensure<float>(be, ws.kk, T * kvs);
  float* v = ensure<float>(be, ws.v, T * kvs);
  float* attn = ensure<float>(be, ws.attn, T * qs);
  float* tmp = ensure<float>(be, ws.tmp, T * H);
  const float eps = static_cast<float>(c.rms_norm_eps);

  auto linear_lora = [&](const LinearWeights& lw, const float* in, int64_t ldx, float* y, int64_t ldy,
                         int64_t layer, LoraModule module) {
    be.linear({.x = in, .m = T, .ldx = ldx, .w = lw.w, .bias = lw.bias, .y = y, .ldy = ldy});
    for (const auto& [slot, rows] : slot_rows) {
      const k::LoraView& view =
          dev[slot]->layers[static_cast<size_t>(layer)].modules[static_cast<size_t>(module)];
      if (view.empty()) continue;
      be.lora_apply({.x = in,
                     .ldx = ldx,
                     .y = y,
                     .ldy = ldy,
                     .rows = reinterpret_cast<const int32_t*>(at(o_slot_rows[slot])),
                     .num_rows = static_cast<int64_t>(rows.size()),
                     .lora = view});
    }
  };

  be.embedding({.ids = d_ids, .m = T, .table = weights_.embed, .out = x, .ld_out = H});
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LayerWeights& lw = weights_.layers[l];
    const AttentionWeights& aw = lw.attn;
    be.rms_norm({.x = x, .ldx = H, .y = h, .ldy = H, .m = T, .n = H, .w = lw.input_norm, .eps = eps});
    linear_lora(aw.q, h, H, q, qs, l, LoraModule::kQ);
    linear_lora(aw.k, h, H, kk, kvs, l, LoraModule::kK);
    linear_lora(aw.v, h, H, v, kvs, l, LoraModule::kV);
    if (c.qk_norm) {
      be.rms_norm(
          {.x = q, .ldx = D, .y = q, .ldy = D, .m = T * c.num_heads, .n = D, .w = aw.q_norm, .eps = eps});
      be.rms_norm({.x = kk,
                   .ldx = D,
                   .y = kk,
                   .ldy = D,
                   .m = T * c.num_kv_heads,
                   .n = D,
                   .w = aw.k_norm,
                   .eps = eps});
    }
    be.rope({.x = q,
             .ldx = qs,
             .m = T,
             .num_heads = c.num_heads,
             .head_dim = D,
             .positions = d_pos,
             .inv_freq = inv_freq_,
             .attention_scaling = rope_.attention_scaling});
    be.rope({.x = kk,
             .ldx = kvs,
             .m = T,
             .num_heads = c.num_kv_heads,
             .head_dim = D,
             .positions = d_pos,
             .inv_freq = inv_freq_,
             .attention_scaling = rope_.attention_scaling});
    be.write_kv({.k = kk, .ldk = kvs, .v = v, .ldv = kvs, .m = T, .slot_mapping = d_slot, .cache = kv[l]});
    be.attention({.q = q,
                  .ldq = qs,
                  .out = attn,
                  .ldo = qs,
                  .num_seqs = S,
                  .num_tokens = T,
                  .query_start = d_qs,
                  .context_lens = d_ctx,
                  .block_tables = d_bt,
                  .max_blocks_per_seq = b.max_blocks_per_seq,
                  .num_heads = c.num_heads,
                  .scale = 1.0f / std::sqrt(static_cast<float>(D)),
                  .window = c.layer_window(l),
                  .sinks = aw.sinks,
                  .cache = kv[l]});
    linear_lora(aw.o, attn, qs, tmp, H, l, LoraModule::kO);
    be.add_inplace(x, tmp, T * H);

    be.rms_norm(
        {.x = x, .ldx = H, .y = h, .ldy = H, .m = T, .n = H, .w = lw.post_attention_norm, .eps = eps});
    if (!lw.is_moe) {
      int64_t I = c.intermediate_size;
      float* gate = ensure<float>(be, ws.gate, T * I);
      float* up = ensure<float>(be, ws.up, T * I);
      float* act = ensure<float>(be, ws.act, T * I);
      linear_lora(lw.mlp.gate, h, H, gate, I, l, LoraModule::kGate);
      linear_lora(lw.mlp.up, h, H, up, I, l, LoraModule::kUp);
      be.silu_and_mul(
          {.gate = gate, .ld_gate = I, .up = up, .ld_up = I, .out = act, .ld_out = I, .m = T, .n = I});
      linear_lora(lw.mlp.down, act, I, tmp, H, l, LoraModule::kDown);
    } else {
      float* router = ensure<float>(be, ws.router, T * E);
      float* route_w = ensure<float>(be, ws.route_w, T * K);
      int32_t* route_ids = ensure<int32_t>(be, ws.route_ids, T * K);
      be.linear({.x = h,
                 .m = T,
                 .ldx = H,
                 .w = lw.moe.router.w,
                 .bias = lw.moe.router.bias,
                 .y = router,
                 .ldy = E});
      be.route({.logits = router,
                .m = T,
                .num_experts = E,
                .top_k = K,
                .scoring = c.router == RouterKind::kTopKSoftmax ? k::RouterScoring::kTopKSoftmax
                                                                : k::RouterScoring::kSoftmaxTopK,
                .renormalize = c.norm_topk_prob,
                .ids = route_ids,
                .weights = route_w});
      bool layer_lora = o_expert_lora[l] != SIZE_MAX;
      be.moe_experts(
          {.x = h,
           .ldx = H,
           .m = T,
           .hidden = H,
           .inter = c.moe_intermediate_size,
           .num_experts = E,
           .top_k = K,
           .ids = route_ids,
           .weights = route_w,
           .experts = lw.moe.experts_on_device,
           .act = c.expert_activation == ExpertActivation::kGptOssClampedSwiglu ? k::ExpertAct::kGptOssSwiglu
                                                                                : k::ExpertAct::kSiluGate,
           .swiglu_alpha = static_cast<float>(c.swiglu_alpha),
           .swiglu_limit = static_cast<float>(c.swiglu_limit),
           .token_slots = layer_lora ? d_tslots : nullptr,
           .lora = layer_lora ? reinterpret_cast<const k::ExpertLoraView*>(at(o_expert_lora[l])) : nullptr,
           .num_slots = layer_lora ? num_slots : 0,
           .out = tmp,
           .ldo = H});
    }
    be.add_inplace(x, tmp, T * H);
  }

  // Final norm and LM head on the wanted rows only.
  if (R == 0) return;
  float* logits_in = ensure<float>(be, ws.logits_in, R * H);
  float* d_logits = ensure<float>(be, ws.logits, R * c.vocab_size);
  be.gather_rows(x, d_rows, R, H, logits_in);
  be.rms_norm({.x = logits_in,
               .ldx = H,
               .y = logits_in,
               .ldy = H,
               .m = R,
               .n = H,
               .w = weights_.final_norm,
               .eps = eps});
  be.linear({.x = logits_in,
             .m = R,
             .ldx = H,
             .w = weights_.lm_head,
             .bias = nullptr,
             .y = d_logits,
             .ldy = c.vocab_size});
  be.copy_to_host(logits, d_logits, static_cast<size_t>(R * c.vocab_size) * sizeof(float));
}

}  // namespace polylora
