// model/lora_dense_ext.h: the dense q/k/v and o LoRA as extra K columns of their products
// (kernels::LinearLoraExtArgs) for the CUDA steps of many tokens (prefill): per layer one BF16 matrix for
// q, k and v stacked ([q_size + 2 kv_size, hidden + tails]) and one for o, each row holding the weights,
// then every slot's B of each module (module by module, slot by slot: the module's rows carry its own B,
// the other modules' rows zeros there), then the bias split into bf16 hi and lo, padded to a multiple of 8
// columns. One GEMM per product then replaces the product, its bias add and lora_batch's expand (which
// re-read and re-wrote the f32 outputs: ~9.8 ms of an 8,192-token GPT-OSS-20B step with 8 adapters on the
// H100). The cost is memory: a second copy of the four projections' weights (GPT-OSS-20B, 8 slots of rank
// 16: ~1.4 GB); the decode paths keep reading the originals.
// The weights are copied at the first refresh (they may still be loading in the background when the
// stacks are reserved); a slot's B at the first refresh after its LoraStacks::slot_version() moved. All
// copies are queued on the backend like ops, so a step queued after a refresh reads them.
// Must not: decide which steps use it (model/forward.cc asks Backend::dense_lora_ext), or own the stacks.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "kernels/linear/linear.h"
#include "model/lora_stacks.h"
#include "model/weights.h"

namespace polylora {

class LoraDenseExt {
 public:
  // One extended product: its matrix, k, each module's tail column (in q, k, v order; o: one) and the
  // bias columns (-1: none).
  struct Product {
    kernels::WeightView w;
    int64_t k = 0;
    int64_t tail[kernels::kMaxLoraGroup] = {};
    int64_t bias_col = -1;
  };

  // Tail columns per product for these stacks (q/k/v: three modules' slots x rank); 0 when the model or
  // the stacks cannot take the path (non-BF16 weights or stacks, a layer without q/k/v/o stacks).
  static int64_t tail_cols(const ModelWeights& weights, const LoraStacks& stacks);

  // Allocates (zeroed) the matrices of every layer for the stacks' slots and rank; nothing is copied yet.
  LoraDenseExt(Backend& backend, const ModelWeights& weights, const LoraStacks& stacks);
  ~LoraDenseExt();
  LoraDenseExt(const LoraDenseExt&) = delete;
  LoraDenseExt& operator=(const LoraDenseExt&) = delete;

  // Queues the copies still owed (the weights at the first call, then the B of slots whose contents
  // changed since the last copy).
  void refresh();
  const Product& qkv(int64_t layer) const { return qkv_[static_cast<size_t>(layer)]; }
  const Product& o(int64_t layer) const { return o_[static_cast<size_t>(layer)]; }
  size_t bytes() const { return bytes_; }
  // tail_cols() of the stacks it was made for.
  int64_t max_tail_cols() const { return tail_cols_; }

 private:
  void copy_slot(int32_t slot);

  Backend& be_;
  const ModelWeights& weights_;
  const LoraStacks& stacks_;
  std::vector<Product> qkv_, o_;
  std::vector<void*> allocations_;
  std::vector<uint64_t> copied_;  // per slot, the slot_version() its B was copied at
  int64_t tail_cols_ = 0;
  bool weights_copied_ = false;
  size_t bytes_ = 0;
};

}  // namespace polylora
