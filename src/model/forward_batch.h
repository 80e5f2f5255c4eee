// model/forward_batch.h: what one forward pass computes: a packed batch of tokens from several sequences
// (prefill chunks and decode tokens mixed), where their keys/values go in the paged KV cache, and which
// adapter each sequence uses. Built by the worker from a step plan; read-only for the model.
#pragma once

#include <cstdint>
#include <vector>

namespace polylora {

struct ForwardBatch {
  std::vector<int32_t> token_ids;     // [num_tokens]
  std::vector<int32_t> positions;     // [num_tokens] absolute position of each token in its sequence
  std::vector<int32_t> query_start;   // [num_seqs + 1] token offsets of each sequence's rows
  std::vector<int32_t> context_lens;  // [num_seqs] tokens in the KV cache after this step (incl. this step)
  std::vector<int32_t> block_tables;  // [num_seqs, max_blocks_per_seq] KV block ids (unused entries: 0)
  int64_t max_blocks_per_seq = 0;
  std::vector<int64_t> slot_mapping;   // [num_tokens] KV slot (block_id·block_size + offset) of each token
  std::vector<int32_t> adapter_slots;  // [num_seqs] adapter slot, −1 for the base model
  std::vector<int32_t> logits_rows;    // token rows whose next-token logits are wanted

  int64_t num_tokens() const { return static_cast<int64_t>(token_ids.size()); }
  int64_t num_seqs() const { return static_cast<int64_t>(context_lens.size()); }
};

}  // namespace polylora
