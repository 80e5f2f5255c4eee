// worker/kv_storage.cc: KV-cache allocation in backend memory.
#include "worker/kv_storage.h"

namespace polylora {

KvStorage::KvStorage(const ModelConfig& cfg, Backend& backend, int64_t num_blocks, int64_t block_size)
    : backend_(backend), num_blocks_(num_blocks), block_size_(block_size) {
  size_t bytes =
      static_cast<size_t>(num_blocks * block_size * cfg.num_kv_heads * cfg.head_dim) * sizeof(float);
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    auto* k = static_cast<float*>(backend.alloc(bytes));
    auto* v = static_cast<float*>(backend.alloc(bytes));
    buffers_.push_back(k);
    buffers_.push_back(v);
    views_.push_back({k, v, num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim});
  }
}

KvStorage::~KvStorage() {
  backend_.synchronize();
  for (void* p : buffers_) backend_.free(p);
}

int64_t KvStorage::bytes_per_block(const ModelConfig& cfg, int64_t block_size) {
  return 2 * cfg.num_layers * block_size * cfg.num_kv_heads * cfg.head_dim *
         static_cast<int64_t>(sizeof(float));
}

}  // namespace polylora
