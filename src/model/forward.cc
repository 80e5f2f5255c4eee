// model/forward.cc: the one forward pass shared by all architectures and backends (Model::run_layers), as
// block builders over one struct of the step's shape and device pointers (Model::ForwardPass):
// embedding -> input RMSNorm -> per layer [attention_block: q/k/v (+LoRA), q/k norm + RoPE + KV-cache write
// (rope_kv_write), paged attention, o (+LoRA), residual add + RMSNorm; then dense_mlp_block (SwiGLU + LoRA)
// or moe_block (router, top-k, experts with expert LoRA); residual add + the next norm] -> lm_head on the
// rows whose logits are wanted. Each residual add runs fused with the norm after it (add_rms_norm). Every op
// reads the step's inputs staged in backend memory (decoder.cc packs and copies them) and the workspace
// buffers (model_step.h); nothing is read back. Must not: allocate outside ensure_buffer; synchronize.
#include <cmath>
#include <initializer_list>
#include <tuple>

#include "model/model.h"
#include "model/model_step.h"

namespace polylora {

namespace k = kernels;

class Model::ForwardPass {
 public:
  ForwardPass(Model& m, const ForwardBatch& b, std::span<const k::KvCacheView> kv, const StepInputs& si,
              std::byte* inputs);
  void run();

 private:
  // LoRA of a group of modules sharing one input (q/k/v, dense gate/up) or of one module: the batched
  // kernels over every token's slot, where some adapter of the step has the module (or, for graphs with
  // LoRA, wherever the stacks hold it).
  bool lora_active(int64_t layer, LoraModule module) const;
  void lora_group(int64_t layer, const float* in, int64_t ldx,
                  std::initializer_list<std::tuple<LoraModule, float*, int64_t>> modules);
  void linear(const LinearWeights& lw, const float* in, int64_t ldx, float* y, int64_t ldy,
              const k::LoraBatchArgs* shrink = nullptr, float* shrink_tmp = nullptr, int64_t ld_tmp = 0);
  // The split shrink of the active modules among `modules` (their sums side by side in lora_tmp_, then
  // `expand` gets each module's LoraExpandIn, empty where the module has no LoRA this step); returns the
  // sum of their ranks.
  int64_t split_group(int64_t layer, const float* in, int64_t ldx, std::initializer_list<LoraModule> modules,
                      k::LoraBatchArgs& a, k::LoraExpandIn* expand);
  void attention_block(int64_t l);
  void dense_mlp_block(int64_t l);
  void moe_block(int64_t l);
  // The residual add with the next norm: the next layer's input norm or, after the last layer, the final
  // norm (of every row: the LM head's rows are gathered from h); the add alone when no logits are wanted.
  void residual_and_next_norm(int64_t l);
  // The norm after layer l (the next layer's input norm, or the final norm when logits are wanted), or
  // nullptr.
  const float* next_norm(int64_t l) const;
  // Whether moe_block's experts already added the residual and ran that norm (MoeExpertsArgs::then_norm).
  bool norm_done_ = false;
  // x += tmp_, then h_ = RMSNorm(x) with weights w (one fused op), with o's split LoRA term in the add.
  void add_norm(const float* w, const k::LoraExpandIn& lora_delta = {});
  void lm_head();

  Model& m_;
  const ModelConfig& c_;  // this rank's counts
  Backend& be_;
  Workspace& ws_;
  const ForwardBatch& b_;
  std::span<const k::KvCacheView> kv_;
  const StepInputs& si_;
  int64_t T_, H_, S_, qs_, kvs_, D_;
  int64_t E_, K_;  // the router's experts (all of them; shard_cfg_ counts this rank's) and top-k
  int64_t R_;      // logits rows
  const int32_t *d_ids_, *d_pos_, *d_qs_, *d_ctx_, *d_bt_, *d_rows_, *d_tslots_, *d_fs_rows_;
  const int64_t* d_slot_;
  float *x_ = nullptr, *h_ = nullptr, *q_ = nullptr, *kk_ = nullptr, *v_ = nullptr, *attn_ = nullptr,
        *tmp_ = nullptr;
  float eps_;
  // Decode-sized steps (Backend::split_dense_lora_max_rows) split the q/k/v and o LoRA over other ops: the
  // shrinks run with the q and o projections, the expands inside rope_kv_write and add_rms_norm. Not with
  // tensor parallelism (o's partial LoRA sums belong before the all_reduce). The shrinks' sums live in
  // lora_tmp_, sized for the largest such step whenever the stacks exist (no allocation inside a capture).
  bool split_lora_ = false;
  float* lora_tmp_ = nullptr;
  // Steps of many tokens with dense LoRA where the backend takes it (Backend::dense_lora_ext): q/k/v as one
  // product and o, each with the LoRA as extra K columns (model/lora_dense_ext.h); q_ then holds q, k and v
  // side by side (rows of qs_ + 2 kvs_).
  const LoraDenseExt* ext_ = nullptr;
  // q/k/v as one extended product (false: the layer's q/k/v have no LoRA this step, or no ext_).
  bool ext_qkv(int64_t l, const float*& k, const float*& v, int64_t& ld);
  bool ext_o(int64_t l);
};

Model::ForwardPass::ForwardPass(Model& m, const ForwardBatch& b, std::span<const k::KvCacheView> kv,
                                const StepInputs& si, std::byte* inputs)
    : m_(m), c_(m.shard_cfg_), be_(*m.backend_), ws_(*m.ws_), b_(b), kv_(kv), si_(si) {
  T_ = b.num_tokens();
  H_ = c_.hidden_size;
  S_ = b.num_seqs();
  qs_ = c_.q_size();
  kvs_ = c_.kv_size();
  D_ = c_.head_dim;
  E_ = m.config_.num_experts;
  K_ = c_.num_experts_per_tok;
  R_ = static_cast<int64_t>(b.logits_rows.size());
  auto at = [&](size_t off) { return inputs + off; };
  d_ids_ = reinterpret_cast<const int32_t*>(at(si.o_ids));
  d_pos_ = reinterpret_cast<const int32_t*>(at(si.o_pos));
  d_qs_ = reinterpret_cast<const int32_t*>(at(si.o_qs));
  d_ctx_ = reinterpret_cast<const int32_t*>(at(si.o_ctx));
  d_bt_ = reinterpret_cast<const int32_t*>(at(si.o_bt));
  d_slot_ = reinterpret_cast<const int64_t*>(at(si.o_slot));
  d_rows_ = reinterpret_cast<const int32_t*>(at(si.o_rows));
  d_tslots_ = reinterpret_cast<const int32_t*>(at(si.o_tslots));
  d_fs_rows_ = reinterpret_cast<const int32_t*>(at(si.o_fs_rows));
  eps_ = static_cast<float>(c_.rms_norm_eps);
}

bool Model::ForwardPass::lora_active(int64_t layer, LoraModule module) const {
  const LoraStacks* lora = m_.lora_.get();
  if (!lora || !lora->reserved() || lora->dense(layer, module).empty()) return false;
  return si_.all_lora || (!si_.adapters.empty() &&
                          si_.adapters.dense[static_cast<size_t>(layer)][static_cast<size_t>(module)]);
}

void Model::ForwardPass::lora_group(int64_t layer, const float* in, int64_t ldx,
                                    std::initializer_list<std::tuple<LoraModule, float*, int64_t>> modules) {
  k::LoraBatchArgs a{.x = in, .ldx = ldx, .m = T_, .token_slots = d_tslots_, .num = 0};
  for (const auto& [mod, y, ldy] : modules) {
    if (!lora_active(layer, mod)) continue;
    a.w[a.num] = m_.lora_->dense(layer, mod);
    a.y[a.num] = y;
    a.ldy[a.num] = ldy;
    ++a.num;
  }
  if (a.num > 0) be_.lora_batch(a);
  if (m_.tp_.fully_sharded_loras && !si_.adapters.empty())  // --fully-sharded-loras: not in the stacks
    for (const auto& [mod, y, ldy] : modules)
      if (si_.adapters.dense[static_cast<size_t>(layer)][static_cast<size_t>(mod)])
        m_.fully_sharded_lora(layer, mod, in, ldx, T_, y, ldy, si_, d_fs_rows_);
}

void Model::ForwardPass::linear(const LinearWeights& lw, const float* in, int64_t ldx, float* y, int64_t ldy,
                                const k::LoraBatchArgs* shrink, float* shrink_tmp, int64_t ld_tmp) {
  be_.linear({.x = in,
              .m = T_,
              .ldx = ldx,
              .w = lw.w,
              .bias = lw.bias,
              .y = y,
              .ldy = ldy,
              .lora_shrink = shrink,
              .lora_tmp = shrink_tmp,
              .lora_ld_tmp = ld_tmp});
}

int64_t Model::ForwardPass::split_group(int64_t layer, const float* in, int64_t ldx,
                                        std::initializer_list<LoraModule> modules, k::LoraBatchArgs& a,
                                        k::LoraExpandIn* expand) {
  a = {.x = in, .ldx = ldx, .m = T_, .token_slots = d_tslots_, .num = 0};
  int64_t first = 0, i = 0;
  for (LoraModule mod : modules) {
    expand[i] = {};
    if (lora_active(layer, mod)) {
      a.w[a.num++] = m_.lora_->dense(layer, mod);
      expand[i] = {
          .token_slots = d_tslots_, .tmp = lora_tmp_, .first = first, .w = m_.lora_->dense(layer, mod)};
      first += m_.lora_->dense(layer, mod).rank;
    }
    ++i;
  }
  for (int64_t j = 0; j < i; ++j) expand[j].ld_tmp = first;
  return first;
}

bool Model::ForwardPass::ext_qkv(int64_t l, const float*& k, const float*& v, int64_t& ld) {
  if (ext_ == nullptr) return false;
  const LoraDenseExt::Product& p = ext_->qkv(l);
  k::LinearLoraExtArgs a{.x = h_, .m = T_, .ldx = H_, .k = p.k, .w = p.w, .y = q_, .ldy = qs_ + 2 * kvs_};
  a.shrink = {.x = h_, .ldx = H_, .m = T_, .token_slots = d_tslots_, .num = 0};
  const LoraModule mods[3] = {LoraModule::kQ, LoraModule::kK, LoraModule::kV};
  for (int i = 0; i < 3; ++i) {
    if (!lora_active(l, mods[i])) continue;
    a.shrink.w[a.shrink.num] = m_.lora_->dense(l, mods[i]);
    a.tail[a.shrink.num++] = p.tail[i];
  }
  if (a.shrink.num == 0) return false;
  a.bias_col = p.bias_col;
  be_.linear_lora_ext(a);
  ld = qs_ + 2 * kvs_;
  k = q_ + qs_;
  v = q_ + qs_ + kvs_;
  return true;
}

bool Model::ForwardPass::ext_o(int64_t l) {
  if (ext_ == nullptr || !lora_active(l, LoraModule::kO)) return false;
  const LoraDenseExt::Product& p = ext_->o(l);
  k::LinearLoraExtArgs a{.x = attn_, .m = T_, .ldx = qs_, .k = p.k, .w = p.w, .y = tmp_, .ldy = H_};
  a.shrink = {.x = attn_, .ldx = qs_, .m = T_, .token_slots = d_tslots_, .num = 1};
  a.shrink.w[0] = m_.lora_->dense(l, LoraModule::kO);
  a.tail[0] = p.tail[0];
  a.bias_col = p.bias_col;
  be_.linear_lora_ext(a);
  return true;
}

void Model::ForwardPass::attention_block(int64_t l) {
  const LayerWeights& lw = m_.weights_.layers[l];
  const AttentionWeights& aw = lw.attn;
  // q, k and v: their rows and strides (one extended product's output, or three products').
  const float* kp = kk_;
  const float* vp = v_;
  int64_t ldq = qs_, ldk = kvs_, ldv = kvs_;
  k::LoraBatchArgs qkv_shrink;
  k::LoraExpandIn qkv_lora[3];
  int64_t qkv_ranks = 0;
  int64_t ld_ext = 0;
  if (ext_qkv(l, kp, vp, ld_ext)) {
    ldq = ldk = ldv = ld_ext;
  } else {
    qkv_ranks = split_lora_ ? split_group(l, h_, H_, {LoraModule::kQ, LoraModule::kK, LoraModule::kV},
                                          qkv_shrink, qkv_lora)
                            : 0;
    // q, k and v read the same h: one launch where the backend can (CUDA at decode sizes).
    const k::LinearArgs qkv[3] = {
        {.x = h_,
         .m = T_,
         .ldx = H_,
         .w = aw.q.w,
         .bias = aw.q.bias,
         .y = q_,
         .ldy = qs_,
         .lora_shrink = qkv_ranks > 0 ? &qkv_shrink : nullptr,
         .lora_tmp = lora_tmp_,
         .lora_ld_tmp = qkv_ranks},
        {.x = h_, .m = T_, .ldx = H_, .w = aw.k.w, .bias = aw.k.bias, .y = kk_, .ldy = kvs_},
        {.x = h_, .m = T_, .ldx = H_, .w = aw.v.w, .bias = aw.v.bias, .y = v_, .ldy = kvs_}};
    be_.linear_group(qkv);
    if (!split_lora_)
      lora_group(l, h_, H_,
                 {{LoraModule::kQ, q_, qs_}, {LoraModule::kK, kk_, kvs_}, {LoraModule::kV, v_, kvs_}});
  }
  // Qwen3's per-head q/k norms, RoPE on q and k, k and v into the paged cache: one op (with the q/k/v
  // LoRA expands when split).
  be_.rope_kv_write({.q = q_,
                     .ldq = ldq,
                     .k = kp,
                     .ldk = ldk,
                     .v = vp,
                     .ldv = ldv,
                     .m = T_,
                     .num_heads = c_.num_heads,
                     .num_kv_heads = c_.num_kv_heads,
                     .head_dim = D_,
                     .positions = d_pos_,
                     .inv_freq = m_.inv_freq_,
                     .attention_scaling = m_.rope_.attention_scaling,
                     .q_norm = c_.qk_norm ? aw.q_norm : nullptr,
                     .k_norm = c_.qk_norm ? aw.k_norm : nullptr,
                     .eps = eps_,
                     .slot_mapping = d_slot_,
                     .cache = kv_[l],
                     .lora_q = qkv_lora[0],
                     .lora_k = qkv_lora[1],
                     .lora_v = qkv_lora[2]});
  be_.attention({.q = q_,
                 .ldq = ldq,
                 .out = attn_,
                 .ldo = qs_,
                 .num_seqs = S_,
                 .num_tokens = T_,
                 .query_start = d_qs_,
                 .context_lens = d_ctx_,
                 .block_tables = d_bt_,
                 .max_blocks_per_seq = b_.max_blocks_per_seq,
                 .num_heads = c_.num_heads,
                 .scale = 1.0f / std::sqrt(static_cast<float>(D_)),
                 .window = c_.layer_window(l),
                 .sinks = aw.sinks,
                 .cache = kv_[l]});
  k::LoraBatchArgs o_shrink;
  k::LoraExpandIn o_lora[1];
  if (!ext_o(l)) {
    const int64_t o_ranks = split_lora_ ? split_group(l, attn_, qs_, {LoraModule::kO}, o_shrink, o_lora) : 0;
    // Its sums after q/k/v's in lora_tmp_ (rope_kv_write has read those).
    for (k::LoraExpandIn& e : o_lora) e.tmp = lora_tmp_ + T_ * qkv_ranks;
    linear(aw.o, attn_, qs_, tmp_, H_, o_ranks > 0 ? &o_shrink : nullptr, lora_tmp_ + T_ * qkv_ranks,
           o_ranks);
    if (!split_lora_) lora_group(l, attn_, qs_, {{LoraModule::kO, tmp_, H_}});
  }
  m_.all_reduce_sum(tmp_, T_ * H_);  // row-parallel o_proj: the ranks' heads
  add_norm(lw.post_attention_norm, o_lora[0]);
}

void Model::ForwardPass::add_norm(const float* w, const k::LoraExpandIn& lora_delta) {
  be_.add_rms_norm({.x = x_,
                    .ldx = H_,
                    .delta = tmp_,
                    .ld_delta = H_,
                    .y = h_,
                    .ldy = H_,
                    .m = T_,
                    .n = H_,
                    .w = w,
                    .eps = eps_,
                    .lora_delta = lora_delta});
}

void Model::ForwardPass::dense_mlp_block(int64_t l) {
  const LayerWeights& lw = m_.weights_.layers[l];
  const int64_t I = c_.intermediate_size;
  float* gate = ensure_buffer<float>(be_, ws_.gate, T_ * I, ws_.epoch);
  float* up = ensure_buffer<float>(be_, ws_.up, T_ * I, ws_.epoch);
  float* act = ensure_buffer<float>(be_, ws_.act, T_ * I, ws_.epoch);
  linear(lw.mlp.gate, h_, H_, gate, I);
  linear(lw.mlp.up, h_, H_, up, I);
  lora_group(l, h_, H_, {{LoraModule::kGate, gate, I}, {LoraModule::kUp, up, I}});
  be_.silu_and_mul(
      {.gate = gate, .ld_gate = I, .up = up, .ld_up = I, .out = act, .ld_out = I, .m = T_, .n = I});
  linear(lw.mlp.down, act, I, tmp_, H_);
  lora_group(l, act, I, {{LoraModule::kDown, tmp_, H_}});
}

void Model::ForwardPass::moe_block(int64_t l) {
  const LayerWeights& lw = m_.weights_.layers[l];
  const bool ep_mask = m_.tp_.expert_parallel && m_.ep_by_mask_;
  float* router = ensure_buffer<float>(be_, ws_.router, T_ * E_, ws_.epoch);
  float* route_w = ensure_buffer<float>(be_, ws_.route_w, T_ * K_, ws_.epoch);
  int32_t* route_ids = ensure_buffer<int32_t>(be_, ws_.route_ids, T_ * K_, ws_.epoch);
  be_.linear({.x = h_,
              .m = T_,
              .ldx = H_,
              .w = lw.moe.router.w,
              .bias = lw.moe.router.bias,
              .y = router,
              .ldy = E_});
  const k::RouteArgs routing{
      .logits = router,
      .m = T_,
      .num_experts = E_,
      .top_k = K_,
      .scoring = c_.router == RouterKind::kTopKSoftmax ? k::RouterScoring::kTopKSoftmax
                                                       : k::RouterScoring::kSoftmaxTopK,
      .renormalize = c_.norm_topk_prob,
      .ids = route_ids,
      .weights = route_w,
      // Expert parallelism by masking: ids in this rank's numbering, other ranks' experts skipped.
      .id_begin = ep_mask ? m_.tp_.expert_begin : 0};
  // The stacks are passed whenever they exist (the workspace is sized with them), the token slots only
  // where LoRA runs in this layer.
  const k::MoeLoraStack expert_lora = m_.lora_ ? m_.lora_->experts(l) : k::MoeLoraStack{};
  const bool layer_lora =
      !expert_lora.empty() &&
      (si_.all_lora || (!si_.adapters.empty() && si_.adapters.experts[static_cast<size_t>(l)]));
  k::MoeExpertsArgs moe{.x = h_,
                        .ldx = H_,
                        .m = T_,
                        .hidden = H_,
                        .inter = c_.moe_intermediate_size,
                        .num_experts = c_.num_experts,
                        .top_k = K_,
                        .ids = route_ids,
                        .weights = route_w,
                        .experts = lw.moe.experts_on_device,
                        .experts_mxfp4 = lw.moe.experts.front().gate_up.mxfp4(),
                        .experts_int8 = lw.moe.experts.front().down.int8(),
                        .act = c_.expert_activation == ExpertActivation::kGptOssClampedSwiglu
                                   ? k::ExpertAct::kGptOssSwiglu
                                   : k::ExpertAct::kSiluGate,
                        .swiglu_alpha = static_cast<float>(c_.swiglu_alpha),
                        .swiglu_limit = static_cast<float>(c_.swiglu_limit),
                        .token_slots = layer_lora ? d_tslots_ : nullptr,
                        .lora_stack = expert_lora,
                        .out = tmp_,
                        .ldo = H_};
  if (m_.tp_.expert_parallel && !ep_mask) {
    be_.route(routing);
    m_.moe_expert_parallel(moe, si_.adapters.token_slots);  // dispatch, local experts, combine
  } else {
    moe.route = routing;  // routed by moe_experts: with the sort in one launch on small CUDA batches
    // The residual add and the next norm in the combine's launch, where nothing is all-reduced between.
    const float* w = next_norm(l);
    if (w != nullptr && m_.comm_ == nullptr) {
      moe.then_norm = {.x = x_, .ldx = H_, .y = h_, .ldy = H_, .m = T_, .n = H_, .w = w, .eps = eps_};
      norm_done_ = true;
    }
    be_.moe_experts(moe);  // (expert parallelism by masking: this rank's experts over every token)
  }
}

const float* Model::ForwardPass::next_norm(int64_t l) const {
  return l + 1 < c_.num_layers ? m_.weights_.layers[l + 1].input_norm
                               : (R_ > 0 ? m_.weights_.final_norm : nullptr);
}

void Model::ForwardPass::residual_and_next_norm(int64_t l) {
  if (norm_done_) {  // by the experts' combine (one rank: nothing to all-reduce)
    norm_done_ = false;
    return;
  }
  m_.all_reduce_sum(tmp_, T_ * H_);  // row-parallel down / experts' down: the ranks' intermediate columns
  if (const float* w = next_norm(l))
    add_norm(w);
  else
    be_.add_inplace(x_, tmp_, T_ * H_);
}

void Model::ForwardPass::lm_head() {
  // On the wanted rows only (h holds every row after the final norm).
  if (R_ == 0) return;
  float* logits_in = ensure_buffer<float>(be_, ws_.logits_in, R_ * H_, ws_.epoch);
  float* d_logits = ensure_buffer<float>(be_, ws_.logits, R_ * c_.vocab_size, ws_.epoch);
  be_.gather_rows(h_, d_rows_, R_, H_, logits_in);
  if (m_.comm_) return m_.lm_head_parallel(logits_in, R_, d_logits);
  be_.linear({.x = logits_in,
              .m = R_,
              .ldx = H_,
              .w = m_.weights_.lm_head,
              .bias = nullptr,
              .y = d_logits,
              .ldy = c_.vocab_size});
}

void Model::ForwardPass::run() {
  // Whether this step queues LoRA kernels (the backend may launch them differently: Backend::set_lora_step).
  struct LoraStepScope {
    Backend& be;
    LoraStepScope(Backend& b, bool lora, int64_t tokens) : be(b) { be.set_lora_step(lora, tokens); }
    ~LoraStepScope() { be.set_lora_step(false, 0); }
  } lora_scope(be_, m_.lora_ && m_.lora_->reserved() && (si_.all_lora || !si_.adapters.empty()), T_);
  x_ = ensure_buffer<float>(be_, ws_.x, T_ * H_, ws_.epoch);
  h_ = ensure_buffer<float>(be_, ws_.h, T_ * H_, ws_.epoch);
  const bool stacks = m_.lora_ && m_.lora_->reserved();
  // With stacks, room for q, k and v side by side (the extended q/k/v product's output).
  q_ = ensure_buffer<float>(be_, ws_.q, T_ * (stacks ? qs_ + 2 * kvs_ : qs_), ws_.epoch);
  kk_ = ensure_buffer<float>(be_, ws_.kk, T_ * kvs_, ws_.epoch);
  v_ = ensure_buffer<float>(be_, ws_.v, T_ * kvs_, ws_.epoch);
  attn_ = ensure_buffer<float>(be_, ws_.attn, T_ * qs_, ws_.epoch);
  tmp_ = ensure_buffer<float>(be_, ws_.tmp, T_ * H_, ws_.epoch);
  split_lora_ = stacks && !m_.comm_ && T_ <= be_.split_dense_lora_max_rows();
  ext_ = nullptr;
  if (stacks && !split_lora_ && !m_.comm_ && m_.lora_ext_ && !si_.all_lora && !si_.adapters.empty() &&
      !be_.dry_run() && be_.dense_lora_ext(T_, m_.lora_ext_->max_tail_cols())) {
    m_.lora_ext_->refresh();
    ext_ = m_.lora_ext_.get();
  }
  if (stacks && be_.split_dense_lora_max_rows() > 0)
    lora_tmp_ = ensure_buffer<float>(
        be_, ws_.lora_tmp, static_cast<size_t>(be_.split_dense_lora_max_rows() * 4 * m_.lora_->rank()),
        ws_.epoch);

  // Tensor parallelism: this rank's vocabulary rows; the others' ids read zeros.
  be_.embedding({.ids = d_ids_,
                 .m = T_,
                 .table = m_.weights_.embed,
                 .out = x_,
                 .ld_out = H_,
                 .id_begin = m_.comm_ ? m_.tp_.vocab_begin : 0,
                 .id_rows = m_.comm_ ? m_.tp_.vocab_rows : 0});
  m_.all_reduce_sum(x_, T_ * H_);  // tensor parallelism: each rank has its vocabulary rows, zeros elsewhere
  // The first layer's input norm; every later norm (post-attention, the next layer's input, the final one)
  // is fused with the residual add before it (add_rms_norm).
  be_.rms_norm({.x = x_,
                .ldx = H_,
                .y = h_,
                .ldy = H_,
                .m = T_,
                .n = H_,
                .w = c_.num_layers > 0 ? m_.weights_.layers[0].input_norm : m_.weights_.final_norm,
                .eps = eps_});
  for (int64_t l = 0; l < c_.num_layers; ++l) {
    attention_block(l);
    if (m_.weights_.layers[l].is_moe) {
      moe_block(l);
    } else {
      dense_mlp_block(l);
    }
    residual_and_next_norm(l);
  }
  lm_head();
}

void Model::run_layers(const ForwardBatch& b, std::span<const k::KvCacheView> kv, const StepInputs& si,
                       std::byte* inputs) {
  ForwardPass(*this, b, kv, si, inputs).run();
}

}  // namespace polylora
