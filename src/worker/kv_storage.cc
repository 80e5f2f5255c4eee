// worker/kv_storage.cc: KV-cache host allocation.
#include "worker/kv_storage.h"

namespace polylora {

KvStorage::KvStorage(const ModelConfig& cfg, int64_t num_blocks, int64_t block_size)
    : num_blocks_(num_blocks), block_size_(block_size) {
  size_t n = static_cast<size_t>(num_blocks * block_size * cfg.num_kv_heads * cfg.head_dim);
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    k_.emplace_back(n, 0.0f);
    v_.emplace_back(n, 0.0f);
    views_.push_back({k_.back().data(), v_.back().data(), num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim});
  }
}

int64_t KvStorage::bytes_per_block(const ModelConfig& cfg, int64_t block_size) {
  return 2 * cfg.num_layers * block_size * cfg.num_kv_heads * cfg.head_dim * static_cast<int64_t>(sizeof(float));
}

}  // namespace polylora
