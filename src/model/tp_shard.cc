// model/tp_shard.cc: see tp_shard.h.
#include "model/tp_shard.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "common/error.h"
#include "common/mxfp4.h"
#include "model/weight_loader.h"

namespace polylora {
namespace {

namespace k = kernels;

struct Range {
  int64_t begin = 0;
  int64_t count = 0;
};

bool interleaved_gate_up(const ModelConfig& cfg) {
  return cfg.expert_activation == ExpertActivation::kGptOssClampedSwiglu;
}

// The rows of a fused [2I, H] expert gate/up (or of its LoRA B, or bias) that carry intermediate columns
// [begin, begin + count): interleaved (GPT-OSS: gate and up alternate) one block, else one in each half.
std::vector<Range> gate_up_rows(const ModelConfig& cfg, int64_t inter, int64_t begin, int64_t count) {
  if (interleaved_gate_up(cfg)) return {{2 * begin, 2 * count}};
  return {{begin, count}, {inter + begin, count}};
}

// Bytes of `cols` codes of a row of w (MXFP4: two per byte).
size_t code_bytes(const k::WeightView& w, int64_t cols) {
  switch (w.dtype) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
      return static_cast<size_t>(cols) * dtype_size(w.dtype);
    case DType::kU8:
      return static_cast<size_t>(cols / 2);
    case DType::kI8:
      return static_cast<size_t>(cols);
    case DType::kI32:
    case DType::kI64:
      break;
  }
  fail("tensor parallelism: a {} weight matrix cannot be split", dtype_name(w.dtype));
}

// Rows [begin, begin + count) of w: a view into it.
k::WeightView take_rows(const k::WeightView& w, int64_t begin, int64_t count) {
  CHECK(begin >= 0 && count >= 0 && begin + count <= w.rows);
  k::WeightView v = w;
  v.rows = count;
  v.data = static_cast<const char*>(w.data) + static_cast<size_t>(begin) * code_bytes(w, w.cols);
  if (w.mxfp4()) v.scales = w.scales + begin * (w.cols / kMxfp4BlockSize);
  if (w.int8()) v.row_scales = w.row_scales + begin;
  return v;
}

// The rows `rows` (concatenated) and columns [col_begin, col_begin + cols) of w, copied into be's memory.
k::WeightView copy_part(const k::WeightView& w, std::span<const Range> rows, int64_t col_begin, int64_t cols,
                        Backend& be) {
  if (w.mxfp4())
    CHECK_MSG(col_begin % kMxfp4BlockSize == 0 && cols % kMxfp4BlockSize == 0,
              "MXFP4 columns split at {} + {} (multiples of {} needed)", col_begin, cols, kMxfp4BlockSize);
  int64_t n = 0;
  for (const Range& r : rows) n += r.count;
  const size_t src_row = code_bytes(w, w.cols), dst_row = code_bytes(w, cols),
               skip = code_bytes(w, col_begin);
  std::vector<std::byte> codes(static_cast<size_t>(n) * dst_row);
  std::vector<uint8_t> scales;
  std::vector<float> row_scales;
  int64_t o = 0;
  for (const Range& r : rows) {
    CHECK(r.begin >= 0 && r.begin + r.count <= w.rows);
    for (int64_t i = r.begin; i < r.begin + r.count; ++i, ++o) {
      std::memcpy(codes.data() + static_cast<size_t>(o) * dst_row,
                  static_cast<const std::byte*>(w.data) + static_cast<size_t>(i) * src_row + skip, dst_row);
      if (w.mxfp4()) {
        const uint8_t* s = w.mxfp4_scales(i) + col_begin / kMxfp4BlockSize;
        scales.insert(scales.end(), s, s + cols / kMxfp4BlockSize);
      }
      if (w.int8()) row_scales.push_back(w.row_scales[i]);  // per row: unchanged by a column split
    }
  }
  k::WeightView v = w;
  v.rows = n;
  v.cols = cols;
  void* d = be.alloc(codes.size());
  be.copy_to_device(d, codes.data(), codes.size());
  v.data = d;
  if (w.mxfp4()) {
    void* s = be.alloc(scales.size());
    be.copy_to_device(s, scales.data(), scales.size());
    v.scales = static_cast<const uint8_t*>(s);
  }
  if (w.int8()) v.row_scales = be.vector_from_host(row_scales.data(), row_scales.size());
  return v;
}

const float* take_vector(const float* v, std::span<const Range> parts, Backend& be) {
  if (!v) return nullptr;
  if (parts.size() == 1) return v + parts[0].begin;
  std::vector<float> out;
  for (const Range& r : parts) out.insert(out.end(), v + r.begin, v + r.begin + r.count);
  return be.vector_from_host(out.data(), out.size());
}

// Column-parallel: output rows `parts` of the matrix and its bias.
LinearWeights column_parallel(const LinearWeights& lw, std::span<const Range> parts, Backend& be) {
  LinearWeights o;
  o.w = parts.size() == 1 ? take_rows(lw.w, parts[0].begin, parts[0].count)
                          : copy_part(lw.w, parts, 0, lw.w.cols, be);
  o.bias = take_vector(lw.bias, parts, be);
  return o;
}

// Row-parallel: input columns [begin, begin + count); the bias is added once, on rank 0.
LinearWeights row_parallel(const LinearWeights& lw, int64_t begin, int64_t count, const TpShard& s,
                           Backend& be) {
  const Range all{0, lw.w.rows};
  return {copy_part(lw.w, {&all, 1}, begin, count, be), s.rank == 0 ? lw.bias : nullptr};
}

k::ExpertView shard_expert(const k::ExpertView& e, const ModelConfig& cfg, const TpShard& s, Backend& be) {
  const int64_t inter = cfg.moe_intermediate_size, n = s.moe_inter_count, begin = s.moe_inter_begin;
  const Range part{begin, n};
  k::ExpertView o;
  if (!e.gate_up.empty()) {
    const std::vector<Range> rows = gate_up_rows(cfg, inter, begin, n);
    o.gate_up = rows.size() == 1 ? take_rows(e.gate_up, rows[0].begin, rows[0].count)
                                 : copy_part(e.gate_up, rows, 0, e.gate_up.cols, be);
    o.gate_up_bias = take_vector(e.gate_up_bias, rows, be);
  } else {
    o.gate = take_rows(e.gate, begin, n);
    o.up = take_rows(e.up, begin, n);
    o.gate_up_bias = take_vector(e.gate_up_bias, gate_up_rows(cfg, inter, begin, n), be);
  }
  const Range all{0, e.down.rows};
  o.down = copy_part(e.down, {&all, 1}, part.begin, part.count, be);
  o.down_bias = s.rank == 0 ? e.down_bias : nullptr;
  return o;
}

// B rows `parts` of a column-parallel module's LoRA (A replicated). `what` names it in errors.
LoraMatrix lora_rows(const LoraMatrix& m, std::span<const Range> parts, const std::string& what) {
  LoraMatrix o{.rank = m.rank, .in = m.in, .out = 0, .scale = m.scale, .a = m.a, .b = {}};
  for (const Range& r : parts) {
    if (r.begin + r.count > m.out)
      fail("{}: its LoRA B has {} output rows; this tensor-parallel rank's share is rows {} to {}", what,
           m.out, r.begin, r.begin + r.count);
    o.b.insert(o.b.end(), m.b.begin() + r.begin * m.rank, m.b.begin() + (r.begin + r.count) * m.rank);
    o.out += r.count;
  }
  return o;
}

// A columns [begin, begin + count) of a row-parallel module's LoRA (B whole).
LoraMatrix lora_cols(const LoraMatrix& m, int64_t begin, int64_t count, const std::string& what) {
  if (begin + count > m.in)
    fail("{}: its LoRA A has {} input columns; this tensor-parallel rank's share is columns {} to {}", what,
         m.in, begin, begin + count);
  LoraMatrix o{.rank = m.rank, .in = count, .out = m.out, .scale = m.scale, .a = {}, .b = m.b};
  o.a.reserve(static_cast<size_t>(m.rank * count));
  for (int64_t r = 0; r < m.rank; ++r)
    o.a.insert(o.a.end(), m.a.begin() + r * m.in + begin, m.a.begin() + r * m.in + begin + count);
  return o;
}

LoraMatrix shard_dense_lora(LoraModule module, const LoraMatrix& m, const std::string& what,
                            const ModelConfig& cfg, const TpShard& s) {
  const int64_t D = cfg.head_dim, heads = cfg.num_heads / s.size;
  const int64_t kv_heads = std::max<int64_t>(1, cfg.num_kv_heads / s.size),
                inter = cfg.intermediate_size / s.size;
  switch (module) {
    case LoraModule::kQ: {
      const Range r{s.head_begin * D, heads * D};
      return lora_rows(m, {&r, 1}, what);
    }
    case LoraModule::kK:
    case LoraModule::kV: {
      const Range r{s.kv_head_begin * D, kv_heads * D};
      return lora_rows(m, {&r, 1}, what);
    }
    case LoraModule::kO:
      return lora_cols(m, s.head_begin * D, heads * D, what);
    case LoraModule::kGate:
    case LoraModule::kUp: {
      const Range r{s.inter_begin, inter};
      return lora_rows(m, {&r, 1}, what);
    }
    case LoraModule::kDown:
      return lora_cols(m, s.inter_begin, inter, what);
  }
  return m;
}

LoraExpert shard_expert_lora(const LoraExpert& e, const std::string& what, const ModelConfig& cfg,
                             const TpShard& s) {
  const int64_t inter = cfg.moe_intermediate_size, n = s.moe_inter_count, begin = s.moe_inter_begin;
  const Range part{begin, n};
  LoraExpert o;
  if (e.gate_up) o.gate_up = lora_rows(*e.gate_up, gate_up_rows(cfg, inter, begin, n), what + " gate_up");
  if (e.gate) o.gate = lora_rows(*e.gate, {&part, 1}, what + " gate");
  if (e.up) o.up = lora_rows(*e.up, {&part, 1}, what + " up");
  if (e.down) o.down = lora_cols(*e.down, begin, n, what + " down");
  return o;
}

// MXFP4 experts in some MoE layer (their intermediate columns split in whole 32-column blocks).
bool any_mxfp4_experts(const ModelConfig& cfg) {
  for (int64_t l = 0; l < cfg.num_layers; ++l)
    if (cfg.moe_layers[static_cast<size_t>(l)] && !cfg.mxfp4_experts.empty() &&
        cfg.mxfp4_experts[static_cast<size_t>(l)])
      return true;
  return false;
}

}  // namespace

void check_tensor_parallel(const ModelConfig& cfg, const TpLayout& layout) {
  const int size = layout.size;
  const std::string what = fmt::format("--tensor-parallel-size {}", size);
  if (size < 1) fail("{}: the size must be at least 1", what);
  if (size == 1) return;
  if (cfg.num_heads % size != 0)
    fail(
        "{}: the model's {} attention heads do not split over {} ranks (tensor parallelism gives each rank "
        "the same number of heads); use a size that divides {}",
        what, cfg.num_heads, size, cfg.num_heads);
  if (cfg.num_kv_heads % size != 0 && size % cfg.num_kv_heads != 0)
    fail(
        "{}: the model's {} KV heads do not split over {} ranks (each rank takes num_kv_heads / size of "
        "them, "
        "or, with more ranks than KV heads, a copy of one: the size must divide {} or be a multiple of it)",
        what, cfg.num_kv_heads, size, cfg.num_kv_heads);
  const int64_t vocab_stride = (cfg.vocab_size + size - 1) / size;
  if ((size - 1) * vocab_stride >= cfg.vocab_size)
    fail("{}: the vocabulary of {} tokens is too small to give each of {} ranks some of it", what,
         cfg.vocab_size, size);
  if (layout.fully_sharded_loras && cfg.hidden_size % size != 0)
    fail(
        "{} with --fully-sharded-loras: the hidden size {} does not split over {} ranks (the LoRA B of "
        "o_proj and down_proj is split by output rows); use a size that divides it, or leave out "
        "--fully-sharded-loras",
        what, cfg.hidden_size, size);
  const bool dense = std::find(cfg.moe_layers.begin(), cfg.moe_layers.end(), false) != cfg.moe_layers.end();
  const bool mxfp4 = any_mxfp4_experts(cfg);
  if (dense && cfg.intermediate_size % size != 0)
    fail("{}: the MLP's intermediate size {} does not split over {} ranks; use a size that divides it", what,
         cfg.intermediate_size, size);
  if (layout.expert_parallel && cfg.is_moe()) {
    if (cfg.num_experts % size != 0)
      fail(
          "{} with --enable-expert-parallel: the model's {} experts do not spread over {} ranks (expert "
          "parallelism gives each rank the same number of whole experts); use a size that divides {}, or "
          "leave out --enable-expert-parallel to split every expert instead",
          what, cfg.num_experts, size, cfg.num_experts);
    return;  // the experts stay whole: their intermediate size need not divide
  }
  if (mxfp4) {  // whole 32-column blocks per rank, as evenly as they go
    if (cfg.moe_intermediate_size / kMxfp4BlockSize < size)
      fail(
          "{}: the MXFP4 experts' intermediate size {} has {} blocks of {} columns, fewer than the {} ranks "
          "(each rank takes whole blocks); use a smaller size",
          what, cfg.moe_intermediate_size, cfg.moe_intermediate_size / kMxfp4BlockSize, kMxfp4BlockSize,
          size);
    return;
  }
  if (cfg.is_moe() && cfg.moe_intermediate_size % size != 0)
    fail("{}: the experts' intermediate size {} does not split over {} ranks; use a size that divides it",
         what, cfg.moe_intermediate_size, size);
}

TpShard make_tp_shard(const ModelConfig& cfg, int rank, const TpLayout& layout) {
  const int size = layout.size;
  CHECK(rank >= 0 && rank < size);
  TpShard s;
  s.rank = rank;
  s.size = size;
  s.head_begin = rank * (cfg.num_heads / size);
  s.kv_head_begin =
      size <= cfg.num_kv_heads ? rank * (cfg.num_kv_heads / size) : rank / (size / cfg.num_kv_heads);
  s.inter_begin = rank * (cfg.intermediate_size / size);
  s.expert_parallel = layout.expert_parallel && cfg.is_moe() && size > 1;
  s.fully_sharded_loras = layout.fully_sharded_loras && size > 1;
  const int64_t I = cfg.moe_intermediate_size;
  if (s.expert_parallel) {
    s.moe_inter_begin = 0;
    s.moe_inter_count = I;
  } else if (any_mxfp4_experts(cfg)) {  // whole blocks: the first (blocks % size) ranks take one more
    const int64_t blocks = I / kMxfp4BlockSize, base = blocks / size, extra = blocks % size;
    s.moe_inter_begin = kMxfp4BlockSize * (rank * base + std::min<int64_t>(rank, extra));
    s.moe_inter_count = kMxfp4BlockSize * (base + (rank < extra ? 1 : 0));
  } else {
    s.moe_inter_begin = rank * (I / size);
    s.moe_inter_count = I / size;
  }
  s.num_local_experts = s.expert_parallel ? cfg.num_experts / size : cfg.num_experts;
  s.expert_begin = s.expert_parallel ? rank * s.num_local_experts : 0;
  s.vocab_stride = (cfg.vocab_size + size - 1) / size;
  s.vocab_begin = std::min<int64_t>(cfg.vocab_size, rank * s.vocab_stride);
  s.vocab_rows = std::min<int64_t>(s.vocab_stride, cfg.vocab_size - s.vocab_begin);
  return s;
}

ModelConfig shard_config(const ModelConfig& cfg, const TpShard& s) {
  ModelConfig c = cfg;
  c.num_heads = cfg.num_heads / s.size;
  c.num_kv_heads = std::max<int64_t>(1, cfg.num_kv_heads / s.size);
  c.intermediate_size = cfg.intermediate_size / s.size;
  c.moe_intermediate_size = s.moe_inter_count;
  c.num_experts = s.num_local_experts;
  return c;
}

ModelWeights shard_weights(const ModelWeights& full, const ModelConfig& cfg, const TpShard& s, Backend& be) {
  const ModelConfig local = shard_config(cfg, s);
  const int64_t D = cfg.head_dim;
  const Range q{s.head_begin * D, local.q_size()}, kv{s.kv_head_begin * D, local.kv_size()};
  const Range inter{s.inter_begin, local.intermediate_size};
  ModelWeights w;
  // The vocabulary rows of the embedding (the lookup gives zeros for the other ranks' ids,
  // kernels::EmbeddingArgs::id_rows) and of the LM head: views.
  CHECK_MSG(
      full.embed.dtype == DType::kF32 || full.embed.dtype == DType::kF16 || full.embed.dtype == DType::kBF16,
      "tensor parallelism: a {} embedding table cannot be split", dtype_name(full.embed.dtype));
  w.embed = take_rows(full.embed, s.vocab_begin, s.vocab_rows);
  w.final_norm = full.final_norm;
  w.lm_head = cfg.tie_word_embeddings ? w.embed : take_rows(full.lm_head, s.vocab_begin, s.vocab_rows);
  w.layers.resize(full.layers.size());
  size_t bytes = w.embed.num_bytes() + (cfg.tie_word_embeddings ? 0 : w.lm_head.num_bytes());
  for (size_t l = 0; l < full.layers.size(); ++l) {
    const LayerWeights& src = full.layers[l];
    LayerWeights& dst = w.layers[l];
    dst.input_norm = src.input_norm;
    dst.post_attention_norm = src.post_attention_norm;
    const AttentionWeights& a = src.attn;
    dst.attn.q = column_parallel(a.q, {&q, 1}, be);
    dst.attn.k = column_parallel(a.k, {&kv, 1}, be);
    dst.attn.v = column_parallel(a.v, {&kv, 1}, be);
    dst.attn.o = row_parallel(a.o, q.begin, q.count, s, be);
    dst.attn.q_norm = a.q_norm;
    dst.attn.k_norm = a.k_norm;
    dst.attn.sinks = a.sinks ? a.sinks + s.head_begin : nullptr;
    for (const LinearWeights* lw : {&dst.attn.q, &dst.attn.k, &dst.attn.v, &dst.attn.o})
      bytes += lw->w.num_bytes();
    dst.is_moe = src.is_moe;
    if (!src.is_moe) {
      dst.mlp.gate = column_parallel(src.mlp.gate, {&inter, 1}, be);
      dst.mlp.up = column_parallel(src.mlp.up, {&inter, 1}, be);
      dst.mlp.down = row_parallel(src.mlp.down, inter.begin, inter.count, s, be);
      for (const LinearWeights* lw : {&dst.mlp.gate, &dst.mlp.up, &dst.mlp.down}) bytes += lw->w.num_bytes();
      continue;
    }
    dst.moe.router = src.moe.router;  // replicated: every rank routes every token the same way
    bytes += dst.moe.router.w.num_bytes();
    for (int64_t i = 0; i < s.num_local_experts; ++i) {
      const k::ExpertView& e = src.moe.experts[static_cast<size_t>(s.expert_begin + i)];
      dst.moe.experts.push_back(s.expert_parallel ? e : shard_expert(e, cfg, s, be));  // EP: whole, a view
      const k::ExpertView& o = dst.moe.experts.back();
      bytes += o.gate_up.num_bytes() + o.gate.num_bytes() + o.up.num_bytes() + o.down.num_bytes();
    }
    const size_t n = dst.moe.experts.size() * sizeof(k::ExpertView);
    void* d = be.alloc(n);
    be.copy_to_device(d, dst.moe.experts.data(), n);
    dst.moe.experts_on_device = static_cast<const k::ExpertView*>(d);
  }
  w.num_bytes = bytes;
  return w;
}

std::shared_ptr<const LoraAdapter> shard_adapter(const LoraAdapter& adapter, const ModelConfig& cfg,
                                                 const TpShard& s) {
  auto out = std::make_shared<LoraAdapter>();
  out->name = adapter.name;
  out->path = adapter.path;
  out->generation = adapter.generation;
  out->max_rank = adapter.max_rank;
  out->has_expert_lora = adapter.has_expert_lora;
  out->layers.resize(adapter.layers.size());
  for (size_t l = 0; l < adapter.layers.size(); ++l) {
    const LoraLayer& src = adapter.layers[l];
    LoraLayer& dst = out->layers[l];
    for (size_t m = 0; m < kNumLoraModules; ++m)
      if (src.modules[m])
        dst.modules[m] = shard_dense_lora(static_cast<LoraModule>(m), *src.modules[m],
                                          fmt::format("adapter '{}', layer {}, {}", adapter.name, l,
                                                      lora_module_name(static_cast<LoraModule>(m))),
                                          cfg, s);
    if (src.experts.empty()) continue;
    if (static_cast<int64_t>(src.experts.size()) != cfg.num_experts)
      fail("adapter '{}', layer {}: LoRA for {} experts, but the model has {}", adapter.name, l,
           src.experts.size(), cfg.num_experts);
    for (int64_t i = 0; i < s.num_local_experts; ++i) {
      const size_t e = static_cast<size_t>(s.expert_begin + i);
      // Expert parallelism: the expert's LoRA whole, on the rank that owns the expert.
      dst.experts.push_back(
          s.expert_parallel
              ? src.experts[e]
              : shard_expert_lora(src.experts[e],
                                  fmt::format("adapter '{}', layer {}, expert {}", adapter.name, l, e), cfg,
                                  s));
    }
  }
  return out;
}

namespace {

k::WeightView copy_matrix(const k::WeightView& w, Backend& be, DType float_target) {
  if (!w.data) return w;
  k::WeightView v = w;
  const auto n = static_cast<size_t>(w.rows * w.cols);
  if (w.mxfp4()) {
    void* codes = be.alloc(n / 2);
    be.copy_to_device(codes, w.data, n / 2);
    void* scales = be.alloc(n / kMxfp4BlockSize);
    be.copy_to_device(scales, w.scales, n / kMxfp4BlockSize);
    v.data = codes;
    v.scales = static_cast<const uint8_t*>(scales);
    return v;
  }
  if (w.int8()) {  // codes, then the row scales, in one allocation (as Backend::quantize_int8 makes them)
    const size_t codes_bytes = (n + 255) / 256 * 256;
    auto* base = static_cast<std::byte*>(be.alloc(codes_bytes + static_cast<size_t>(w.rows) * sizeof(float)));
    be.copy_to_device(base, w.data, n);
    be.copy_to_device(base + codes_bytes, w.row_scales, static_cast<size_t>(w.rows) * sizeof(float));
    v.data = base;
    v.row_scales = reinterpret_cast<const float*>(base + codes_bytes);
    return v;
  }
  return be.matrix_from_host_as(w, float_target);
}

const float* copy_vector(const float* v, int64_t n, Backend& be) {
  return v ? be.vector_from_host(v, static_cast<size_t>(n)) : nullptr;
}

LinearWeights copy_linear(const LinearWeights& lw, Backend& be, DType target) {
  return {copy_matrix(lw.w, be, target), copy_vector(lw.bias, lw.w.rows, be)};
}

}  // namespace

void trim_rank_weights(ModelWeights& w, const ModelConfig& cfg, const TpShard& s, Backend& be,
                       uint64_t seed) {
  const bool tied = w.lm_head.data == w.embed.data;
  w.embed = take_rows(w.embed, s.vocab_begin, s.vocab_rows);
  w.lm_head = tied ? w.embed : take_rows(w.lm_head, s.vocab_begin, s.vocab_rows);
  if (s.expert_parallel) {  // every rank routes over all experts, with the same router
    const int64_t E = cfg.num_experts, H = cfg.hidden_size;
    for (size_t l = 0; l < w.layers.size(); ++l) {
      LinearWeights& router = w.layers[l].moe.router;
      if (!w.layers[l].is_moe) continue;
      uint64_t state = seed * 0x9e3779b97f4a7c15ull + 0x5eed0000ull + l;  // the same on every rank
      auto uniform = [&] { return static_cast<float>(dummy_uniform(state)); };
      auto values = std::make_unique<float[]>(static_cast<size_t>(E * H));
      for (int64_t i = 0; i < E * H; ++i) values[i] = uniform() * kDummyStddev * 1.7320508f;
      router.w = be.matrix_from_host_as({values.get(), DType::kF32, E, H}, DType::kF32);
      w.owned_f32.push_back(std::move(values));  // the CPU's view points into it
      if (router.bias) {
        std::vector<float> bias(static_cast<size_t>(E));
        for (float& b : bias) b = uniform() * kDummyStddev;
        router.bias = be.vector_from_host(bias.data(), bias.size());
      }
    }
  }
  if (s.rank == 0) return;
  for (LayerWeights& l : w.layers) {
    l.attn.o.bias = nullptr;
    l.mlp.down.bias = nullptr;
    if (!l.is_moe || s.expert_parallel) continue;  // (whole experts keep their down bias on their rank)
    for (k::ExpertView& e : l.moe.experts) e.down_bias = nullptr;
    be.copy_to_device(const_cast<k::ExpertView*>(l.moe.experts_on_device), l.moe.experts.data(),
                      l.moe.experts.size() * sizeof(k::ExpertView));
  }
}

ModelWeights copy_weights(const ModelWeights& host, const ModelConfig& local, Backend& be) {
  const DType wt = be.weight_dtype();
  const int64_t H = local.hidden_size, D = local.head_dim;
  const size_t before = be.allocated_bytes();
  ModelWeights w;
  w.embed = copy_matrix(host.embed, be, wt);
  w.lm_head = host.lm_head.data == host.embed.data ? w.embed : copy_matrix(host.lm_head, be, wt);
  w.final_norm = copy_vector(host.final_norm, H, be);
  w.layers.resize(host.layers.size());
  for (size_t l = 0; l < host.layers.size(); ++l) {
    const LayerWeights& src = host.layers[l];
    LayerWeights& dst = w.layers[l];
    dst.input_norm = copy_vector(src.input_norm, H, be);
    dst.post_attention_norm = copy_vector(src.post_attention_norm, H, be);
    dst.attn.q = copy_linear(src.attn.q, be, wt);
    dst.attn.k = copy_linear(src.attn.k, be, wt);
    dst.attn.v = copy_linear(src.attn.v, be, wt);
    dst.attn.o = copy_linear(src.attn.o, be, wt);
    dst.attn.q_norm = copy_vector(src.attn.q_norm, D, be);
    dst.attn.k_norm = copy_vector(src.attn.k_norm, D, be);
    dst.attn.sinks = copy_vector(src.attn.sinks, local.num_heads, be);
    dst.is_moe = src.is_moe;
    if (!src.is_moe) {
      dst.mlp = {copy_linear(src.mlp.gate, be, wt), copy_linear(src.mlp.up, be, wt),
                 copy_linear(src.mlp.down, be, wt)};
      continue;
    }
    dst.moe.router = copy_linear(src.moe.router, be, DType::kF32);
    for (const k::ExpertView& e : src.moe.experts) {
      k::ExpertView d;
      d.gate_up = copy_matrix(e.gate_up, be, wt);
      d.gate = copy_matrix(e.gate, be, wt);
      d.up = copy_matrix(e.up, be, wt);
      d.down = copy_matrix(e.down, be, wt);
      d.gate_up_bias = copy_vector(e.gate_up_bias, e.gate_up.rows, be);
      d.down_bias = copy_vector(e.down_bias, H, be);
      dst.moe.experts.push_back(d);
    }
    const size_t bytes = dst.moe.experts.size() * sizeof(k::ExpertView);
    void* p = be.alloc(bytes);
    be.copy_to_device(p, dst.moe.experts.data(), bytes);
    dst.moe.experts_on_device = static_cast<const k::ExpertView*>(p);
  }
  w.num_bytes = be.allocated_bytes() - before;
  return w;
}

}  // namespace polylora
