// model/lora_stacks.cc: allocation of the slot-stacked LoRA tensors and the upload of one adapter into
// one slot (lora_stacks.h).
#include "model/lora_stacks.h"

#include <algorithm>
#include <cstring>

#include "common/error.h"

namespace polylora {
namespace {

constexpr int kStagingBuffers = 4;
constexpr size_t kStagingBytes = size_t{8} << 20;

bool has_module(const ModelConfig& c, int64_t layer, LoraModule m) {
  switch (m) {
    case LoraModule::kQ:
    case LoraModule::kK:
    case LoraModule::kV:
    case LoraModule::kO:
      return true;
    case LoraModule::kGate:
    case LoraModule::kUp:
    case LoraModule::kDown:
      return !c.moe_layers[static_cast<size_t>(layer)];
  }
  return false;
}

std::pair<int64_t, int64_t> module_shape(const ModelConfig& c, LoraModule m) {  // in, out
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  switch (m) {
    case LoraModule::kQ:
      return {H, c.q_size()};
    case LoraModule::kK:
    case LoraModule::kV:
      return {H, c.kv_size()};
    case LoraModule::kO:
      return {c.q_size(), H};
    case LoraModule::kGate:
    case LoraModule::kUp:
      return {H, I};
    case LoraModule::kDown:
      return {I, H};
  }
  return {0, 0};
}

// Row `r` of A (rank rows) or B (out rows) of an optional matrix into dst[cols], zero-padded: A rows past
// the matrix's rank are zero, B rows take the matrix's rank columns and zeros after.
void a_row(const std::optional<LoraMatrix>& m, int64_t r, int64_t cols, float* dst) {
  if (!m || r >= m->rank) {
    std::fill(dst, dst + cols, 0.0f);
    return;
  }
  std::copy_n(m->a.data() + r * m->in, cols, dst);
}
void b_row(const std::optional<LoraMatrix>& m, int64_t row, int64_t cols, float* dst) {
  std::fill(dst, dst + cols, 0.0f);
  if (!m) return;
  std::copy_n(m->b.data() + row * m->rank, std::min(m->rank, cols), dst);
}

}  // namespace

LoraStacks::LoraStacks(Backend& backend, const ModelConfig& config) : be_(backend), config_(config) {
  dtype_ = backend.kind() == DeviceKind::kCuda && backend.weight_dtype() != DType::kF32 ? DType::kBF16 : DType::kF32;
  gu_slices_ = config.expert_activation == ExpertActivation::kGptOssClampedSwiglu ? 1 : 2;
}

LoraStacks::~LoraStacks() { release(); }

void LoraStacks::release() {
  staging_.reset();
  for (void* p : allocations_) be_.free(p);
  allocations_.clear();
  dense_.clear();
  experts_.clear();
  d_scales_ = nullptr;
  slots_ = rank_ = 0;
  bytes_ = 0;
  held_.clear();
}

size_t LoraStacks::bytes_for(int64_t slots, int64_t rank) const {
  const ModelConfig& c = config_;
  const int64_t R = (rank + 7) / 8 * 8, E = c.num_experts, H = c.hidden_size, I = c.moe_intermediate_size;
  const size_t es = dtype_size(dtype_);
  size_t n = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    for (size_t m = 0; m < kNumLoraModules; ++m) {
      const auto mod = static_cast<LoraModule>(m);
      if (!has_module(c, l, mod)) continue;
      auto [in, out] = module_shape(c, mod);
      n += static_cast<size_t>(slots * R * (in + out)) * es;
    }
    if (c.moe_layers[static_cast<size_t>(l)])
      n += static_cast<size_t>(slots * E * R * (gu_slices_ * H + 2 * I + I + H)) * es;
  }
  return n;
}

void LoraStacks::reserve(int64_t slots, int64_t rank) {
  CHECK(slots > 0 && rank > 0);
  release();
  ++epoch_;
  const ModelConfig& c = config_;
  const int64_t R = (rank + 7) / 8 * 8, E = c.num_experts, H = c.hidden_size, I = c.moe_intermediate_size;
  const size_t es = dtype_size(dtype_);
  auto alloc = [&](size_t bytes) {
    void* p = be_.alloc(bytes);
    allocations_.push_back(p);
    bytes_ += bytes;
    return p;
  };
  slots_ = slots;
  rank_ = R;
  dense_.assign(static_cast<size_t>(c.num_layers), {});
  experts_.assign(static_cast<size_t>(c.num_layers), {});
  for (int64_t l = 0; l < c.num_layers; ++l) {
    for (size_t m = 0; m < kNumLoraModules; ++m) {
      const auto mod = static_cast<LoraModule>(m);
      if (!has_module(c, l, mod)) continue;
      auto [in, out] = module_shape(c, mod);
      Dense& d = dense_[static_cast<size_t>(l)][m];
      d.in = in;
      d.out = out;
      d.a = alloc(static_cast<size_t>(slots * R * in) * es);
      d.b = alloc(static_cast<size_t>(slots * out * R) * es);
    }
    if (!c.moe_layers[static_cast<size_t>(l)]) continue;
    Experts& x = experts_[static_cast<size_t>(l)];
    x.a_gu = alloc(static_cast<size_t>(slots * E * gu_slices_ * R * H) * es);
    x.b_gu = alloc(static_cast<size_t>(slots * E * 2 * I * R) * es);
    x.a_down = alloc(static_cast<size_t>(slots * E * R * I) * es);
    x.b_down = alloc(static_cast<size_t>(slots * E * H * R) * es);
  }
  experts_scale_offset_ = static_cast<size_t>(c.num_layers) * kNumLoraModules * static_cast<size_t>(slots);
  scales_.assign(experts_scale_offset_ + static_cast<size_t>(c.num_layers * slots * E * 3), 0.0f);
  d_scales_ = static_cast<float*>(alloc(scales_.size() * sizeof(float)));
  held_.assign(static_cast<size_t>(slots), {});
  // Made after the allocations (and their zeroing), so the uploads are ordered after them.
  staging_ = be_.make_upload_staging(kStagingBuffers, kStagingBytes);
}

template <typename Fill>
void LoraStacks::put(void* dst, int64_t rows, int64_t cols, const Fill& fill) {
  const int64_t per = std::max<int64_t>(1, static_cast<int64_t>(kStagingBytes / (sizeof(float) * cols)));
  CHECK_MSG(static_cast<size_t>(cols) * sizeof(float) <= kStagingBytes, "LoRA row of {} values is too long", cols);
  const size_t es = dtype_size(dtype_);
  for (int64_t r0 = 0; r0 < rows; r0 += per) {
    const int64_t n = std::min(per, rows - r0);
    const int i = next_buffer_;
    next_buffer_ = (next_buffer_ + 1) % staging_->num_buffers();
    staging_->wait(i);
    auto* buf = reinterpret_cast<float*>(staging_->buffer(i));
    for (int64_t r = 0; r < n; ++r) fill(r0 + r, buf + r * cols);
    staging_->upload(i, {.rows = n,
                         .cols = cols,
                         .src_dtype = DType::kF32,
                         .dst = static_cast<char*>(dst) + static_cast<size_t>(r0 * cols) * es,
                         .dst_dtype = dtype_,
                         .dst_ld = cols,
                         .transpose = false});
  }
}

void LoraStacks::upload_scales() {
  const int64_t n = static_cast<int64_t>(scales_.size());
  const int64_t per = static_cast<int64_t>(kStagingBytes / sizeof(float));
  for (int64_t o = 0; o < n; o += per) {
    const int64_t len = std::min(per, n - o);
    const int i = next_buffer_;
    next_buffer_ = (next_buffer_ + 1) % staging_->num_buffers();
    staging_->wait(i);
    std::memcpy(staging_->buffer(i), scales_.data() + o, static_cast<size_t>(len) * sizeof(float));
    staging_->upload(i, {.rows = 1, .cols = len, .src_dtype = DType::kF32, .dst = d_scales_ + o,
                         .dst_dtype = DType::kF32, .dst_ld = len, .transpose = false});
  }
}

void LoraStacks::upload(int32_t slot, const LoraAdapter& ad) {
  const ModelConfig& c = config_;
  CHECK_MSG(slot >= 0 && slot < slots_, "LoRA slot {} outside the {} reserved", slot, slots_);
  CHECK_MSG(ad.max_rank <= rank_, "adapter '{}' has rank {}, above the reserved {}", ad.name, ad.max_rank, rank_);
  CHECK(static_cast<int64_t>(ad.layers.size()) == c.num_layers);
  const int64_t R = rank_, E = c.num_experts, H = c.hidden_size, I = c.moe_intermediate_size, S = slots_;
  const size_t es = dtype_size(dtype_);
  held_[static_cast<size_t>(slot)] = {};
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LoraLayer& src = ad.layers[static_cast<size_t>(l)];
    for (size_t m = 0; m < kNumLoraModules; ++m) {
      const Dense& d = dense_[static_cast<size_t>(l)][m];
      float& scale = scales_[(static_cast<size_t>(l) * kNumLoraModules + m) * static_cast<size_t>(S) +
                             static_cast<size_t>(slot)];
      const std::optional<LoraMatrix>& mat = src.modules[m];
      scale = 0.0f;
      if (!d.a) continue;  // ignored by the loader's checks already: the model has no such module here
      if (!mat) continue;  // the scale 0 keeps the stale rows unread
      put(static_cast<char*>(d.a) + static_cast<size_t>(slot * R * d.in) * es, R, d.in,
          [&](int64_t r, float* dst) { a_row(mat, r, d.in, dst); });
      put(static_cast<char*>(d.b) + static_cast<size_t>(slot * d.out * R) * es, d.out, R,
          [&](int64_t r, float* dst) { b_row(mat, r, R, dst); });
      scale = mat->scale;
    }
    const Experts& x = experts_[static_cast<size_t>(l)];
    float* esc = scales_.data() + experts_scale_offset_ + static_cast<size_t>((l * S + slot) * E * 3);
    std::fill(esc, esc + E * 3, 0.0f);
    if (!x.a_gu || src.experts.empty()) continue;
    CHECK(static_cast<int64_t>(src.experts.size()) == E);
    const int64_t G = gu_slices_;
    // The matrix feeding slice `sl` of gate/up: the fused gate_up LoRA, or gate (slice 0) / up (slice 1).
    auto gu_src = [&](int64_t e, int64_t sl) -> const std::optional<LoraMatrix>& {
      const LoraExpert& le = src.experts[static_cast<size_t>(e)];
      if (G == 1 || le.gate_up) return le.gate_up;
      return sl == 0 ? le.gate : le.up;
    };
    put(static_cast<char*>(x.a_gu) + static_cast<size_t>(slot * E * G * R * H) * es, E * G * R, H,
        [&](int64_t q, float* dst) { a_row(gu_src(q / (G * R), (q % (G * R)) / R), q % R, H, dst); });
    put(static_cast<char*>(x.b_gu) + static_cast<size_t>(slot * E * 2 * I * R) * es, E * 2 * I, R,
        [&](int64_t q, float* dst) {
          const int64_t e = q / (2 * I), n = q % (2 * I);
          const LoraExpert& le = src.experts[static_cast<size_t>(e)];
          if (G == 1 || le.gate_up) return b_row(le.gate_up, n, R, dst);
          return n < I ? b_row(le.gate, n, R, dst) : b_row(le.up, n - I, R, dst);
        });
    put(static_cast<char*>(x.a_down) + static_cast<size_t>(slot * E * R * I) * es, E * R, I,
        [&](int64_t q, float* dst) { a_row(src.experts[static_cast<size_t>(q / R)].down, q % R, I, dst); });
    put(static_cast<char*>(x.b_down) + static_cast<size_t>(slot * E * H * R) * es, E * H, R,
        [&](int64_t q, float* dst) { b_row(src.experts[static_cast<size_t>(q / H)].down, q % H, R, dst); });
    for (int64_t e = 0; e < E; ++e) {
      const LoraExpert& le = src.experts[static_cast<size_t>(e)];
      for (int64_t sl = 0; sl < G; ++sl) {
        const std::optional<LoraMatrix>& m = gu_src(e, sl);
        esc[e * 3 + sl] = m ? m->scale : 0.0f;
      }
      esc[e * 3 + 2] = le.down ? le.down->scale : 0.0f;
    }
  }
  upload_scales();
  staging_->finish();
  held_[static_cast<size_t>(slot)] = {&ad, ad.generation};
}

void LoraStacks::clear(int32_t slot) {
  if (slot < 0 || slot >= slots_) return;
  const ModelConfig& c = config_;
  const size_t S = static_cast<size_t>(slots_), E = static_cast<size_t>(c.num_experts);
  for (size_t l = 0; l < static_cast<size_t>(c.num_layers); ++l) {
    for (size_t m = 0; m < kNumLoraModules; ++m) scales_[(l * kNumLoraModules + m) * S + static_cast<size_t>(slot)] = 0.0f;
    float* esc = scales_.data() + experts_scale_offset_ + (l * S + static_cast<size_t>(slot)) * E * 3;
    std::fill(esc, esc + E * 3, 0.0f);
  }
  upload_scales();
  staging_->finish();
  held_[static_cast<size_t>(slot)] = {};
}

bool LoraStacks::holds(int32_t slot, const LoraAdapter& adapter) const {
  if (slot < 0 || slot >= slots_) return false;
  const Held& h = held_[static_cast<size_t>(slot)];
  return h.adapter == &adapter && h.generation != 0 && h.generation == adapter.generation;
}

kernels::LoraStack LoraStacks::dense(int64_t layer, LoraModule module) const {
  if (!reserved()) return {};
  const Dense& d = dense_[static_cast<size_t>(layer)][static_cast<size_t>(module)];
  if (!d.a) return {};
  return {.a = d.a,
          .b = d.b,
          .dtype = dtype_,
          .scale = d_scales_ + (static_cast<size_t>(layer) * kNumLoraModules + static_cast<size_t>(module)) *
                                   static_cast<size_t>(slots_),
          .slots = slots_,
          .rank = rank_,
          .in = d.in,
          .out = d.out};
}

kernels::MoeLoraStack LoraStacks::experts(int64_t layer) const {
  if (!reserved()) return {};
  const Experts& x = experts_[static_cast<size_t>(layer)];
  if (!x.a_gu) return {};
  return {.a_gu = x.a_gu,
          .b_gu = x.b_gu,
          .a_down = x.a_down,
          .b_down = x.b_down,
          .dtype = dtype_,
          .scale = d_scales_ + experts_scale_offset_ +
                   static_cast<size_t>(layer * slots_ * config_.num_experts * 3),
          .slots = slots_,
          .rank = rank_,
          .gu_slices = gu_slices_};
}

}  // namespace polylora
