// tests/golden/tp_batch.h: a mixed batch of every fixture variant x prompt and its two steps (prefill with
// every logits row, then one decode step over the KV cache it wrote), for comparing a split model
// (tensor parallelism) with the unsplit one: tests/golden/tp_golden_test.cc (CPU), tests/gpu/tp_gpu_test.cc.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "golden/golden_fixture.h"
#include "worker/kv_storage.h"

namespace polylora::golden {

// A batch of one prefill sequence per (variant, prompt), variants interleaved, each in its own blocks, with
// the logits of every row; then `decode` adds one token per sequence (next_ids) at the end of each.
struct MixedBatch {
  ForwardBatch b;
  std::vector<const LoraAdapter*> adapters;  // [slot]
  std::vector<int32_t> prompt_lens;

  static constexpr int64_t kBlock = 16, kBlocksPerSeq = 4;

  explicit MixedBatch(const Fixture& f) {
    for (const auto& a : f.adapters) adapters.push_back(a.get());
    b.max_blocks_per_seq = kBlocksPerSeq;
    b.query_start = {0};
    int32_t seq = 0;
    for (size_t i = 0; i < f.num_prompts(); ++i)
      for (size_t v = 0; v < f.variants.size(); ++v, ++seq) {
        const std::vector<int32_t> p = f.prompt(i);
        EXPECT_LT(static_cast<int64_t>(p.size()), kBlock * kBlocksPerSeq);
        for (size_t t = 0; t < p.size(); ++t) {
          b.token_ids.push_back(p[t]);
          b.positions.push_back(static_cast<int32_t>(t));
          b.slot_mapping.push_back(seq * kBlocksPerSeq * kBlock + static_cast<int64_t>(t));
          b.logits_rows.push_back(static_cast<int32_t>(b.token_ids.size() - 1));
        }
        b.query_start.push_back(static_cast<int32_t>(b.token_ids.size()));
        b.context_lens.push_back(static_cast<int32_t>(p.size()));
        for (int64_t k = 0; k < kBlocksPerSeq; ++k)
          b.block_tables.push_back(static_cast<int32_t>(seq * kBlocksPerSeq + k));
        b.adapter_slots.push_back(static_cast<int32_t>(v) - 1);  // variant 0 is "base"
        prompt_lens.push_back(static_cast<int32_t>(p.size()));
      }
    EXPECT_EQ(f.variants.front(), "base");
  }
  int64_t num_blocks() const { return b.num_seqs() * kBlocksPerSeq; }

  ForwardBatch decode(const std::vector<int32_t>& next_ids) const {
    ForwardBatch d;
    d.max_blocks_per_seq = kBlocksPerSeq;
    d.block_tables = b.block_tables;
    d.adapter_slots = b.adapter_slots;
    d.query_start = {0};
    for (int64_t s = 0; s < b.num_seqs(); ++s) {
      const int32_t pos = prompt_lens[s];
      d.token_ids.push_back(next_ids[s]);
      d.positions.push_back(pos);
      d.slot_mapping.push_back(s * kBlocksPerSeq * kBlock + pos);
      d.context_lens.push_back(pos + 1);
      d.query_start.push_back(static_cast<int32_t>(s + 1));
      d.logits_rows.push_back(static_cast<int32_t>(s));
    }
    return d;
  }
};

// Logits of the mixed batch's prefill and of the decode step after it (greedy on the -tp 1 prefill).
struct TwoSteps {
  std::vector<float> prefill, decode;
};
inline TwoSteps run_two_steps(Model& m, const MixedBatch& mb, const std::vector<int32_t>* next_ids,
                              std::vector<int32_t>* argmax_out) {
  const int64_t V = m.config().vocab_size;
  KvStorage kv(m.kv_config(), m.backend(), mb.num_blocks(), MixedBatch::kBlock);
  TwoSteps out;
  out.prefill.resize(mb.b.logits_rows.size() * static_cast<size_t>(V));
  m.forward(mb.b, kv.views(), mb.adapters, out.prefill.data());
  std::vector<int32_t> ids;
  for (int64_t s = 0; s < mb.b.num_seqs(); ++s) {
    const float* row = out.prefill.data() + static_cast<size_t>(mb.b.query_start[s + 1] - 1) * V;
    ids.push_back(static_cast<int32_t>(std::max_element(row, row + V) - row));
  }
  if (argmax_out) *argmax_out = ids;
  ForwardBatch d = mb.decode(next_ids ? *next_ids : ids);
  out.decode.resize(d.logits_rows.size() * static_cast<size_t>(V));
  m.forward(d, kv.views(), mb.adapters, out.decode.data());
  return out;
}

inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) d = std::max(d, std::fabs(double(a[i]) - b[i]));
  return d;
}

}  // namespace polylora::golden
