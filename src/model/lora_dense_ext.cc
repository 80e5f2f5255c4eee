// model/lora_dense_ext.cc: the extended q/k/v and o matrices (lora_dense_ext.h).
#include "model/lora_dense_ext.h"

#include <algorithm>
#include <array>
#include <cstring>

#include "common/dtype.h"
#include "common/error.h"

namespace polylora {

namespace {

constexpr std::array<LoraModule, 3> kQkv = {LoraModule::kQ, LoraModule::kK, LoraModule::kV};

int64_t round8(int64_t v) {
  return (v + 7) / 8 * 8;
}

bool plain_bf16(const kernels::WeightView& w) {
  return !w.empty() && w.dtype == DType::kBF16;
}

}  // namespace

int64_t LoraDenseExt::tail_cols(const ModelWeights& weights, const LoraStacks& stacks) {
  if (!stacks.reserved() || stacks.dtype() != DType::kBF16 || weights.layers.empty()) return 0;
  int64_t most = 0;
  for (int64_t l = 0; l < static_cast<int64_t>(weights.layers.size()); ++l) {
    const AttentionWeights& aw = weights.layers[static_cast<size_t>(l)].attn;
    if (!plain_bf16(aw.q.w) || !plain_bf16(aw.k.w) || !plain_bf16(aw.v.w) || !plain_bf16(aw.o.w) ||
        aw.k.w.cols != aw.q.w.cols || aw.v.w.cols != aw.q.w.cols)
      return 0;
    const kernels::WeightView* ws[3] = {&aw.q.w, &aw.k.w, &aw.v.w};
    int64_t qkv = 0;
    for (size_t i = 0; i < kQkv.size(); ++i) {
      const kernels::LoraStack st = stacks.dense(l, kQkv[i]);
      if (st.empty() || st.dtype != DType::kBF16 || st.out != ws[i]->rows || st.in != ws[i]->cols) return 0;
      qkv += st.slots * st.rank;
    }
    const kernels::LoraStack so = stacks.dense(l, LoraModule::kO);
    if (so.empty() || so.dtype != DType::kBF16 || so.out != aw.o.w.rows || so.in != aw.o.w.cols) return 0;
    most = std::max({most, qkv, so.slots * so.rank});
  }
  return most;
}

LoraDenseExt::LoraDenseExt(Backend& backend, const ModelWeights& weights, const LoraStacks& stacks)
    : be_(backend), weights_(weights), stacks_(stacks) {
  tail_cols_ = tail_cols(weights, stacks);
  CHECK_MSG(tail_cols_ > 0, "the dense LoRA as extra K needs BF16 q/k/v/o and stacks");
  const int64_t S = stacks.slots();
  const auto layers = static_cast<int64_t>(weights.layers.size());
  qkv_.resize(static_cast<size_t>(layers));
  o_.resize(static_cast<size_t>(layers));
  auto make = [&](Product& p, int64_t rows, int64_t k, std::initializer_list<LoraModule> mods, int64_t l,
                  bool bias) {
    p.k = k;
    int64_t col = k, i = 0;
    for (LoraModule mod : mods) {
      p.tail[i++] = col;
      col += S * stacks.dense(l, mod).rank;
    }
    if (bias) {
      p.bias_col = col;
      col += 2;
    }
    const int64_t cols = round8(col);
    const size_t bytes = static_cast<size_t>(rows * cols) * sizeof(uint16_t);
    void* mem = be_.alloc(bytes);
    allocations_.push_back(mem);
    be_.fill_zero(mem, bytes);
    bytes_ += bytes;
    p.w = kernels::WeightView{.data = mem, .dtype = DType::kBF16, .rows = rows, .cols = cols};
  };
  for (int64_t l = 0; l < layers; ++l) {
    const AttentionWeights& aw = weights.layers[static_cast<size_t>(l)].attn;
    make(qkv_[static_cast<size_t>(l)], aw.q.w.rows + aw.k.w.rows + aw.v.w.rows, aw.q.w.cols,
         {LoraModule::kQ, LoraModule::kK, LoraModule::kV}, l,
         aw.q.bias != nullptr || aw.k.bias != nullptr || aw.v.bias != nullptr);
    make(o_[static_cast<size_t>(l)], aw.o.w.rows, aw.o.w.cols, {LoraModule::kO}, l, aw.o.bias != nullptr);
  }
  copied_.assign(static_cast<size_t>(S), ~uint64_t{0});  // none copied yet
}

LoraDenseExt::~LoraDenseExt() {
  try {
    be_.synchronize();  // no queued copy or step reads the matrices
  } catch (...) {
  }
  for (void* p : allocations_) be_.free(p);
}

void LoraDenseExt::refresh() {
  if (!weights_copied_) {
    // The weights into the first k columns, the biases as bf16 hi and lo (through the host, once).
    std::vector<void*> temps;
    auto place = [&](const Product& p, int64_t row0, const LinearWeights& lw) {
      const int64_t rows = lw.w.rows, cols = p.w.cols;
      auto* dst = static_cast<uint16_t*>(const_cast<void*>(p.w.data)) + row0 * cols;
      be_.copy_2d(dst, static_cast<size_t>(cols) * 2, lw.w.data, static_cast<size_t>(lw.w.cols) * 2,
                  static_cast<size_t>(lw.w.cols) * 2, static_cast<size_t>(rows));
      if (p.bias_col < 0 || lw.bias == nullptr) return;
      std::vector<float> bias(static_cast<size_t>(rows));
      be_.copy_to_host(bias.data(), lw.bias, bias.size() * sizeof(float));
      std::vector<uint16_t> pairs(2 * bias.size());
      for (size_t r = 0; r < bias.size(); ++r) {
        pairs[2 * r] = f32_to_bf16(bias[r]);
        pairs[2 * r + 1] = f32_to_bf16(bias[r] - bf16_to_f32(pairs[2 * r]));
      }
      void* tmp = be_.alloc(pairs.size() * sizeof(uint16_t));
      temps.push_back(tmp);
      be_.copy_to_device(tmp, pairs.data(), pairs.size() * sizeof(uint16_t));
      be_.copy_2d(dst + p.bias_col, static_cast<size_t>(cols) * 2, tmp, 4, 4, static_cast<size_t>(rows));
    };
    for (size_t l = 0; l < qkv_.size(); ++l) {
      const AttentionWeights& aw = weights_.layers[l].attn;
      place(qkv_[l], 0, aw.q);
      place(qkv_[l], aw.q.w.rows, aw.k);
      place(qkv_[l], aw.q.w.rows + aw.k.w.rows, aw.v);
      place(o_[l], 0, aw.o);
    }
    be_.synchronize();  // the temporaries are read
    for (void* t : temps) be_.free(t);
    weights_copied_ = true;
  }
  for (size_t s = 0; s < copied_.size(); ++s) {
    const uint64_t v = stacks_.slot_version(static_cast<int32_t>(s));
    if (copied_[s] == v) continue;
    copy_slot(static_cast<int32_t>(s));
    copied_[s] = v;
  }
}

void LoraDenseExt::copy_slot(int32_t slot) {
  // Module i's B of the slot ([out, rank] in the stack) into its rows at its tail's slot columns.
  auto put = [&](const Product& p, int64_t i, int64_t row0, const kernels::LoraStack& st) {
    const int64_t cols = p.w.cols, R = st.rank;
    auto* dst = static_cast<uint16_t*>(const_cast<void*>(p.w.data)) + row0 * cols + p.tail[i] + slot * R;
    const auto* src = static_cast<const uint16_t*>(st.b) + static_cast<int64_t>(slot) * st.out * R;
    be_.copy_2d(dst, static_cast<size_t>(cols) * 2, src, static_cast<size_t>(R) * 2,
                static_cast<size_t>(R) * 2, static_cast<size_t>(st.out));
  };
  for (size_t l = 0; l < qkv_.size(); ++l) {
    const auto li = static_cast<int64_t>(l);
    int64_t row0 = 0;
    for (size_t i = 0; i < kQkv.size(); ++i) {
      const kernels::LoraStack st = stacks_.dense(li, kQkv[i]);
      put(qkv_[l], static_cast<int64_t>(i), row0, st);
      row0 += st.out;
    }
    put(o_[l], 0, 0, stacks_.dense(li, LoraModule::kO));
  }
}

}  // namespace polylora
