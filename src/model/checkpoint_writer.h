// model/checkpoint_writer.h: writes a checkpoint of random values with the exact tensor names and shapes
// the loader reads for a config.json (the architecture binders' own list, arch::expected_tensors), as
// Hugging Face lays it out: model.safetensors, or shards model-0000k-of-0000N.safetensors with
// model.safetensors.index.json. For start-up benchmarks of real-size models (GPT-OSS-20B in bf16 is 41.8 GB)
// and round-trip tests. Many threads generate and write 64 MiB pieces with pwrite at once.
// Must not: be needed to serve (a tool).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/dtype.h"

namespace polylora {

struct CheckpointWriteOptions {
  int num_shards = 0;          // 0: one shard per ~5 GB (Hugging Face's default); 1: one model.safetensors
  DType dtype = DType::kBF16;  // of every tensor: BF16, F16 or F32
  float scale = 0.02f;         // matrices uniform in [-scale, scale]; vectors fill ± scale (norms ~1)
  uint64_t seed = 1;
  int num_threads = 0;                    // 0: hardware threads
  size_t chunk_bytes = size_t{64} << 20;  // per write
};

struct CheckpointWriteStats {
  uint64_t bytes = 0;  // of all files written
  size_t num_tensors = 0;
  size_t num_files = 0;  // safetensors files
  double seconds = 0;
};

// Reads <config_dir>/config.json and writes the checkpoint into `out_dir` (created if needed; existing
// safetensors files and index there are replaced). The other regular files of config_dir (tokenizer,
// generation config, chat template) are copied along, except safetensors files and indexes. Errors name
// the file that could not be written.
CheckpointWriteStats write_random_checkpoint(const std::string& config_dir, const std::string& out_dir,
                                             const CheckpointWriteOptions& options = {});

}  // namespace polylora
