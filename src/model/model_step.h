// model/model_step.h: the Model's step state shared by decoder.cc (staging, graphs, warm-up) and forward.cc
// (the forward pass): the workspace buffers every op writes, a step's staged inputs, and ensure_buffer().
// Included by those two files only. Must not: be included outside model/.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "lora/adapter_batch.h"
#include "model/model.h"

namespace polylora {

// A backend allocation of the workspace (grown by ensure_buffer).
struct ModelBuffer {
  void* ptr = nullptr;
  size_t cap = 0;
};

struct Model::Workspace {
  ModelBuffer x, h, q, kk, v, attn, tmp, gate, up, act, router, route_w, route_ids, logits_in, logits, inputs;
  ModelBuffer lora_tmp;      // dense LoRA split over other ops: the q/k/v and o shrinks' sums [rows, ranks]
  ModelBuffer graph_inputs;  // fixed once graphs are prepared: every graph reads its inputs here
  ModelBuffer ids;           // argmax ids of the output rows (forward_argmax)
  std::vector<std::byte> staging;        // where a step's inputs are packed
  ModelBuffer logits_shard, logits_all;  // tensor parallelism: this rank's logits columns, every rank's
  ModelBuffer feed_src;  // tensor parallelism on GPUs: rank 0's fed token ids, broadcast to this rank
  ModelBuffer fs_shrink,
      fs_gathered;  // fully sharded LoRA: the shrinks [T, width], every rank's [N, T, width]
  // Two page-locked buffers the packed inputs are copied from, alternately: a step is staged while the
  // copy of the previous one may still be queued. `consumed` marks when the copy out of it has run.
  struct Pinned {
    void* ptr = nullptr;
    size_t cap = 0;
    void* consumed = nullptr;
    bool in_use = false;
  };
  std::array<Pinned, 2> pinned;
  int next_pinned = 0;
  int64_t output_rows = 0;  // logits rows of the last launch
  uint64_t epoch = 0;       // moves when any buffer above is reallocated
};

// A step's inputs packed in host staging: offsets of each array, and the step's adapter batch.
struct Model::StepInputs {
  size_t o_ids = 0, o_pos = 0, o_qs = 0, o_ctx = 0, o_bt = 0, o_slot = 0, o_rows = 0, o_tslots = 0,
         o_feed = 0, o_fs_rows = 0;
  AdapterBatch adapters;
  // Fully sharded LoRA: each slot's token rows, staged at o_fs_rows; fs_rows[slot] = (first, count).
  std::vector<std::pair<int64_t, int64_t>> fs_rows;
  // Launch the LoRA kernels of every module the stacks hold, whatever the step's adapters (graphs with
  // LoRA: any mix of slots replays them; the kernels skip tokens and slots without LoRA).
  bool all_lora = false;
};

// Grows `b` to at least `bytes` (contents are not kept) and returns it. Every reallocation moves
// `epoch` (captured graphs hold the old pointers).
template <typename T>
inline T* ensure_buffer(Backend& be, ModelBuffer& b, size_t count, uint64_t& epoch) {
  size_t bytes = count * sizeof(T);
  if (b.cap < bytes) {
    ++epoch;
    if (b.ptr) be.free(b.ptr);
    b.cap = std::max(bytes, b.cap + b.cap / 2);
    b.ptr = be.alloc(b.cap);
  }
  return static_cast<T*>(b.ptr);
}

}  // namespace polylora
