// worker/batch_builder.cc: StepPlan deltas -> request states -> the packed step.
#include "worker/batch_builder.h"

#include <algorithm>

#include "common/error.h"

namespace polylora {

void BatchBuilder::apply(const StepPlan& plan) {
  for (RequestId id : plan.finished_ids) states_.erase(id);
  for (RequestId id : plan.preempted_ids) states_.erase(id);
  for (const auto& n : plan.new_requests) {
    RequestState s;
    s.tokens = n.token_ids;
    s.num_prompt_tokens = n.num_prompt_tokens;
    s.blocks = n.block_ids;
    s.num_computed_tokens = n.num_computed_tokens;
    s.adapter = n.adapter;
    s.prompt_logprobs = n.prompt_logprobs;
    s.sampling = n.sampling;
    CHECK_MSG(s.sampling, "request {} arrived in the plan without sampling settings", n.id);
    states_[n.id] = std::move(s);
  }
  for (const auto& r : plan.running) {
    RequestState& s = states_.at(r.id);
    s.blocks.insert(s.blocks.end(), r.new_block_ids.begin(), r.new_block_ids.end());
    CHECK_MSG(s.num_computed_tokens == r.num_computed_tokens, "runner and scheduler disagree on request {}",
              r.id);
  }
}

void BatchBuilder::build(const StepPlan& plan, const AdapterRegistry* adapters, const int32_t* feed_src,
                         Step& out) {
  ForwardBatch& b = out.batch;
  b.token_ids.clear();
  b.positions.clear();
  b.query_start.assign(1, 0);
  b.context_lens.clear();
  b.slot_mapping.clear();
  b.adapter_slots.clear();
  b.logits_rows.clear();
  b.max_blocks_per_seq = 0;
  out.rows.clear();
  out.adapters.clear();
  out.order.clear();
  out.feed.pairs.clear();
  out.feed.src = feed_src;
  for (const auto& n : plan.new_requests) out.order.emplace_back(n.id, n.num_scheduled_tokens);
  for (const auto& r : plan.running) out.order.emplace_back(r.id, r.num_scheduled_tokens);
  const int64_t bs = block_size_;
  for (const auto& [id, num] : out.order) {
    RequestState& s = states_.at(id);
    b.max_blocks_per_seq = std::max<int64_t>(b.max_blocks_per_seq, static_cast<int64_t>(s.blocks.size()));
    const int64_t begin = s.num_computed_tokens, end = begin + num;
    const auto last = static_cast<int64_t>(s.tokens.size()) - 1;
    CHECK_MSG(end <= last + 1, "request {} scheduled past its tokens", id);
    CHECK_MSG(end <= static_cast<int64_t>(s.blocks.size()) * bs, "request {} lacks KV blocks", id);
    for (int64_t p = begin; p < end; ++p) {
      if (p == last && s.pending_row >= 0) {
        CHECK_MSG(feed_src, "request {}: a token is still being sampled and nothing feeds it", id);
        out.feed.pairs.push_back(static_cast<int32_t>(b.token_ids.size()));
        out.feed.pairs.push_back(s.pending_row);
      }
      b.token_ids.push_back(s.tokens[p]);
      b.positions.push_back(static_cast<int32_t>(p));
      b.slot_mapping.push_back(static_cast<int64_t>(s.blocks[p / bs]) * bs + p % bs);
      const bool sample = p == last;
      const bool prompt_row = s.prompt_logprobs && p + 1 < s.num_prompt_tokens;
      if (sample || prompt_row) {
        b.logits_rows.push_back(static_cast<int32_t>(b.token_ids.size() - 1));
        out.rows.push_back({id, p, sample});
      }
    }
    b.query_start.push_back(static_cast<int32_t>(b.token_ids.size()));
    b.context_lens.push_back(static_cast<int32_t>(end));
    int32_t slot = -1;
    if (!s.adapter.base()) {
      CHECK_MSG(adapters, "request {} has an adapter and the step has no adapter registry", id);
      slot = adapters->slot_of(s.adapter);
      CHECK_MSG(slot >= 0, "request {}: adapter '{}' is in no device slot", id, adapters->name_of(s.adapter));
      if (out.adapters.size() <= static_cast<size_t>(slot)) out.adapters.resize(static_cast<size_t>(slot) + 1);
      out.adapters[static_cast<size_t>(slot)] = adapters->adapter_in_slot(slot);
    }
    b.adapter_slots.push_back(slot);
  }
  b.block_tables.assign(out.order.size() * static_cast<size_t>(b.max_blocks_per_seq), 0);
  for (size_t i = 0; i < out.order.size(); ++i) {
    const auto& blocks = states_.at(out.order[i].first).blocks;
    std::copy(blocks.begin(), blocks.end(),
              b.block_tables.begin() + static_cast<long>(i) * b.max_blocks_per_seq);
  }
}

void BatchBuilder::advance(const Step& step) {
  for (const auto& [id, num] : step.order) states_.at(id).num_computed_tokens += num;
  for (size_t r = 0; r < step.rows.size(); ++r) {
    if (!step.rows[r].sample) continue;
    RequestState& s = states_.at(step.rows[r].id);
    s.tokens.push_back(0);
    s.pending_row = static_cast<int32_t>(r);
  }
}

void BatchBuilder::fill(RequestId id, int64_t position, int32_t token) {
  auto it = states_.find(id);
  if (it == states_.end()) return;
  RequestState& s = it->second;
  CHECK_MSG(position >= 0 && position < static_cast<int64_t>(s.tokens.size()),
            "request {}: token {} came back for position {}", id, token, position);
  s.tokens[static_cast<size_t>(position)] = token;
  if (position == static_cast<int64_t>(s.tokens.size()) - 1) s.pending_row = -1;
}

const BatchBuilder::RequestState* BatchBuilder::find(RequestId id) const {
  auto it = states_.find(id);
  return it == states_.end() ? nullptr : &it->second;
}

}  // namespace polylora
