// worker/kv_storage.cc: KV-cache allocation in backend memory.
#include "worker/kv_storage.h"

#include "common/error.h"

namespace polylora {

KvStorage::KvStorage(const ModelConfig& cfg, Backend& backend, int64_t num_blocks, int64_t block_size,
                     DType dtype)
    : backend_(backend), num_blocks_(num_blocks), block_size_(block_size) {
  if (dtype != DType::kF32 && dtype != DType::kBF16)
    fail("the KV cache is F32 or BF16, not {}", dtype_name(dtype));
  if (dtype == DType::kBF16 && backend.kind() != DeviceKind::kCuda)
    fail("a BF16 KV cache (--kv-cache-dtype bfloat16) needs a CUDA backend (the CPU kernels keep it in f32)");
  size_t bytes =
      static_cast<size_t>(num_blocks * block_size * cfg.num_kv_heads * cfg.head_dim) * dtype_size(dtype);
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    void* k = backend.alloc(bytes);
    void* v = backend.alloc(bytes);
    buffers_.push_back(k);
    buffers_.push_back(v);
    views_.push_back({.k = k,
                      .v = v,
                      .num_blocks = num_blocks,
                      .block_size = block_size,
                      .num_kv_heads = cfg.num_kv_heads,
                      .head_dim = cfg.head_dim,
                      .dtype = dtype});
  }
}

KvStorage::~KvStorage() {
  backend_.synchronize();
  for (void* p : buffers_) backend_.free(p);
}

int64_t KvStorage::bytes_per_block(const ModelConfig& cfg, int64_t block_size, DType dtype) {
  return 2 * cfg.num_layers * block_size * cfg.num_kv_heads * cfg.head_dim *
         static_cast<int64_t>(dtype_size(dtype));
}

}  // namespace polylora
