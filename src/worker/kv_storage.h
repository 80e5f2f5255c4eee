// worker/kv_storage.h: backend memory for the paged KV cache of every layer (F32, or BF16 on CUDA backends:
// --kv-cache-dtype).
// Owns: the K and V arrays [num_blocks, block_size, num_kv_heads, head_dim] per layer.
// Must not: decide which blocks a request gets (that is cache/'s job).
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "config/model_config.h"
#include "kernels/attention/attention.h"

namespace polylora {

class KvStorage {
 public:
  KvStorage(const ModelConfig& cfg, Backend& backend, int64_t num_blocks, int64_t block_size,
            DType dtype = DType::kF32);
  ~KvStorage();
  KvStorage(const KvStorage&) = delete;
  KvStorage& operator=(const KvStorage&) = delete;
  const std::vector<kernels::KvCacheView>& views() const { return views_; }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t block_size() const { return block_size_; }
  // Bytes one block takes across all layers (K and V).
  static int64_t bytes_per_block(const ModelConfig& cfg, int64_t block_size, DType dtype = DType::kF32);

 private:
  Backend& backend_;
  int64_t num_blocks_;
  int64_t block_size_;
  std::vector<void*> buffers_;
  std::vector<kernels::KvCacheView> views_;
};

}  // namespace polylora
