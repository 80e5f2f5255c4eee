// worker/generator.cc: fixed-plan batched greedy generation over the paged KV cache.
#include "worker/generator.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "common/error.h"

namespace polylora {

Generator::Generator(Model& model, GeneratorOptions options) : model_(model), options_(options) {}

std::vector<GenerateResult> Generator::run(const std::vector<GenerateRequest>& requests,
                                           std::span<const LoraAdapter* const> adapters) {
  const ModelConfig& cfg = model_.config();
  const int64_t bs = options_.block_size;
  const int64_t n = static_cast<int64_t>(requests.size());
  const int64_t vocab = cfg.vocab_size;
  std::vector<GenerateResult> results(static_cast<size_t>(n));
  if (n == 0) return results;

  // Each sequence gets a contiguous run of blocks for prompt + max_tokens.
  std::vector<int64_t> first_block(static_cast<size_t>(n));
  int64_t total_blocks = 0, max_blocks = 0;
  for (int64_t i = 0; i < n; ++i) {
    const auto& r = requests[i];
    if (r.prompt.empty()) fail("request {}: the prompt is empty", i);
    int64_t len = static_cast<int64_t>(r.prompt.size()) + r.max_tokens;
    int64_t blocks = (len + bs - 1) / bs;
    first_block[i] = total_blocks;
    total_blocks += blocks;
    max_blocks = std::max(max_blocks, blocks);
  }
  // The cache is kept across runs that fit it (a model's CUDA graphs are recorded against one cache).
  if (!kv_ || kv_->num_blocks() < total_blocks)
    kv_ = std::make_unique<KvStorage>(cfg, model_.backend(), total_blocks, bs);
  KvStorage& kv = *kv_;

  auto fill_tables = [&](ForwardBatch& b, const std::vector<int64_t>& seqs) {
    b.max_blocks_per_seq = max_blocks;
    b.block_tables.assign(seqs.size() * static_cast<size_t>(max_blocks), 0);
    for (size_t s = 0; s < seqs.size(); ++s)
      for (int64_t j = 0; j < max_blocks; ++j)
        b.block_tables[s * max_blocks + j] = static_cast<int32_t>(first_block[seqs[s]] + j);
  };
  auto slot_of = [&](int64_t seq, int64_t pos) { return (first_block[seq] + pos / bs) * bs + pos % bs; };
  auto record_top = [&](int64_t seq, const float* row) {
    int64_t n = requests[seq].top_ids;
    if (n <= 0) return;
    std::vector<int32_t> idx(static_cast<size_t>(vocab));
    for (int64_t v = 0; v < vocab; ++v) idx[v] = static_cast<int32_t>(v);
    n = std::min(n, vocab);
    std::partial_sort(idx.begin(), idx.begin() + n, idx.end(),
                      [&](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
    results[seq].step_top_ids.emplace_back(idx.begin(), idx.begin() + n);
  };
  auto argmax = [&](const float* row, float* margin) {
    int64_t best = 0;
    for (int64_t v = 1; v < vocab; ++v)
      if (row[v] > row[best]) best = v;
    float second = -INFINITY;
    for (int64_t v = 0; v < vocab; ++v)
      if (v != best) second = std::max(second, row[v]);
    *margin = row[best] - second;
    return static_cast<int32_t>(best);
  };

  std::vector<int32_t> next(static_cast<size_t>(n));
  std::vector<int64_t> ctx(static_cast<size_t>(n), 0);
  std::vector<float> logits;
  std::vector<int32_t> ids;
  auto t0 = std::chrono::steady_clock::now();
  // Prefill: chunks of whole prompts (a long prompt is split across passes).
  {
    int64_t seq = 0, offset = 0;
    while (seq < n) {
      ForwardBatch b;
      std::vector<int64_t> seqs;
      b.query_start.push_back(0);
      std::vector<std::pair<int64_t, int64_t>> rows_owner;  // logits row -> (seq, prompt position)
      while (seq < n && b.num_tokens() < options_.max_batch_tokens) {
        const auto& r = requests[seq];
        int64_t len = static_cast<int64_t>(r.prompt.size());
        int64_t take = std::min(len - offset, options_.max_batch_tokens - b.num_tokens());
        for (int64_t p = offset; p < offset + take; ++p) {
          b.token_ids.push_back(r.prompt[p]);
          b.positions.push_back(static_cast<int32_t>(p));
          b.slot_mapping.push_back(slot_of(seq, p));
          if (r.prompt_logits || p == len - 1) {
            b.logits_rows.push_back(static_cast<int32_t>(b.token_ids.size() - 1));
            rows_owner.emplace_back(seq, p);
          }
        }
        seqs.push_back(seq);
        b.query_start.push_back(static_cast<int32_t>(b.token_ids.size()));
        b.context_lens.push_back(static_cast<int32_t>(offset + take));
        b.adapter_slots.push_back(r.adapter_slot);
        ctx[seq] = offset + take;
        if (offset + take == len) {
          ++seq;
          offset = 0;
        } else {
          offset += take;
        }
      }
      fill_tables(b, seqs);
      logits.resize(b.logits_rows.size() * static_cast<size_t>(vocab));
      model_.forward(b, kv.views(), adapters, logits.data());
      for (size_t r = 0; r < rows_owner.size(); ++r) {
        auto [s, p] = rows_owner[r];
        const auto& req = requests[s];
        const float* row = logits.data() + r * vocab;
        if (req.prompt_logits) {
          auto& pl = results[s].prompt_logits;
          pl.resize(req.prompt.size() * static_cast<size_t>(vocab));
          std::copy(row, row + vocab, pl.begin() + p * vocab);
        }
        if (p == static_cast<int64_t>(req.prompt.size()) - 1 && req.max_tokens > 0) {
          float margin;
          next[s] = argmax(row, &margin);
          record_top(s, row);
          results[s].output.push_back(next[s]);
          results[s].margins.push_back(margin);
        }
      }
    }
  }
  auto t1 = std::chrono::steady_clock::now();
  // Decode: every unfinished sequence advances one token per step.
  auto finished = [&](int64_t s) {
    const auto& r = requests[s];
    const auto& out = results[s].output;
    if (static_cast<int64_t>(out.size()) >= r.max_tokens) return true;
    return !out.empty() &&
           std::find(r.stop_token_ids.begin(), r.stop_token_ids.end(), out.back()) != r.stop_token_ids.end();
  };
  decode_steps_ = 0;
  decode_gpu_seconds_ = 0;
  while (true) {
    ForwardBatch b;
    std::vector<int64_t> seqs;
    b.query_start.push_back(0);
    for (int64_t s = 0; s < n; ++s) {
      if (finished(s)) continue;
      int64_t pos = ctx[s];
      b.token_ids.push_back(next[s]);
      b.positions.push_back(static_cast<int32_t>(pos));
      b.slot_mapping.push_back(slot_of(s, pos));
      b.logits_rows.push_back(static_cast<int32_t>(b.token_ids.size() - 1));
      b.query_start.push_back(static_cast<int32_t>(b.token_ids.size()));
      b.context_lens.push_back(static_cast<int32_t>(pos + 1));
      b.adapter_slots.push_back(requests[s].adapter_slot);
      seqs.push_back(s);
      ctx[s] = pos + 1;
    }
    if (seqs.empty()) break;
    fill_tables(b, seqs);
    if (options_.device_argmax) {  // ids only: no margins or top ids
      ids.resize(seqs.size());
      model_.forward_argmax(b, kv.views(), adapters, ids.data());
      decode_gpu_seconds_ += model_.last_step_gpu_seconds();
      ++decode_steps_;
      for (size_t i = 0; i < seqs.size(); ++i) {
        next[seqs[i]] = ids[i];
        results[seqs[i]].output.push_back(ids[i]);
      }
      continue;
    }
    logits.resize(seqs.size() * static_cast<size_t>(vocab));
    model_.forward(b, kv.views(), adapters, logits.data());
    decode_gpu_seconds_ += model_.last_step_gpu_seconds();
    ++decode_steps_;
    for (size_t i = 0; i < seqs.size(); ++i) {
      float margin;
      next[seqs[i]] = argmax(logits.data() + i * vocab, &margin);
      record_top(seqs[i], logits.data() + i * vocab);
      results[seqs[i]].output.push_back(next[seqs[i]]);
      results[seqs[i]].margins.push_back(margin);
    }
  }
  auto t2 = std::chrono::steady_clock::now();
  prefill_seconds_ = std::chrono::duration<double>(t1 - t0).count();
  decode_seconds_ = std::chrono::duration<double>(t2 - t1).count();
  return results;
}

}  // namespace polylora
