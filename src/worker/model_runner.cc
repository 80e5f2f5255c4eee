// worker/model_runner.cc: StepPlan -> ForwardBatch -> forward -> sample -> StepResult.
#include "worker/model_runner.h"

#include <algorithm>

#include "common/error.h"

namespace polylora {

ModelRunner::ModelRunner(Model& model, int64_t num_blocks, int64_t block_size)
    : model_(model),
      kv_(model.config(), model.backend(), num_blocks, block_size),
      sampler_(model.config().vocab_size) {}

void ModelRunner::apply_plan(const StepPlan& plan) {
  for (RequestId id : plan.finished_ids) states_.erase(id);
  for (RequestId id : plan.preempted_ids) states_.erase(id);
  for (const auto& n : plan.new_requests) {
    State s;
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
    State& s = states_.at(r.id);
    s.blocks.insert(s.blocks.end(), r.new_block_ids.begin(), r.new_block_ids.end());
    CHECK_MSG(s.num_computed_tokens == r.num_computed_tokens, "runner and scheduler disagree on request {}",
              r.id);
  }
}

void ModelRunner::prepare(const StepPlan& plan,
                          const std::function<const LoraAdapter*(const std::string&)>& adapter_of,
                          PreparedStep& out) {
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
  out.slots.clear();
  out.order.clear();
  for (const auto& n : plan.new_requests) out.order.emplace_back(n.id, n.num_scheduled_tokens);
  for (const auto& r : plan.running) out.order.emplace_back(r.id, r.num_scheduled_tokens);
  const int64_t bs = kv_.block_size();
  std::vector<std::string> step_adapters;
  for (const auto& [id, num] : out.order) {
    State& s = states_.at(id);
    b.max_blocks_per_seq = std::max<int64_t>(b.max_blocks_per_seq, static_cast<int64_t>(s.blocks.size()));
    int64_t begin = s.num_computed_tokens, end = begin + num;
    CHECK_MSG(end <= static_cast<int64_t>(s.tokens.size()), "request {} scheduled past its tokens", id);
    CHECK_MSG(end <= static_cast<int64_t>(s.blocks.size()) * bs, "request {} lacks KV blocks", id);
    for (int64_t p = begin; p < end; ++p) {
      b.token_ids.push_back(s.tokens[p]);
      b.positions.push_back(static_cast<int32_t>(p));
      b.slot_mapping.push_back(static_cast<int64_t>(s.blocks[p / bs]) * bs + p % bs);
      bool sample = p == static_cast<int64_t>(s.tokens.size()) - 1;
      bool prompt_row = s.prompt_logprobs && p + 1 < s.num_prompt_tokens;
      if (sample || prompt_row) {
        b.logits_rows.push_back(static_cast<int32_t>(b.token_ids.size() - 1));
        out.rows.push_back({id, p, sample});
      }
    }
    b.query_start.push_back(static_cast<int32_t>(b.token_ids.size()));
    b.context_lens.push_back(static_cast<int32_t>(end));
    int32_t slot = -1;
    if (!s.adapter.empty()) {
      auto it = std::find(step_adapters.begin(), step_adapters.end(), s.adapter);
      if (it == step_adapters.end()) {
        step_adapters.push_back(s.adapter);
        out.slots.push_back(adapter_of(s.adapter));
        slot = static_cast<int32_t>(out.slots.size() - 1);
      } else {
        slot = static_cast<int32_t>(it - step_adapters.begin());
      }
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

void ModelRunner::advance_for_benchmark(const PreparedStep& step,
                                        const std::unordered_map<RequestId, int32_t>& sampled) {
  for (const auto& [id, num] : step.order) {
    State& s = states_.at(id);
    s.num_computed_tokens += num;
    auto it = sampled.find(id);
    if (it != sampled.end()) s.tokens.push_back(it->second);
  }
}

StepResult ModelRunner::execute(const StepPlan& plan,
                                const std::function<const LoraAdapter*(const std::string&)>& adapter_of) {
  apply_plan(plan);
  StepResult result;
  if (plan.empty()) return result;
  prepare(plan, adapter_of, step_);
  const ForwardBatch& b = step_.batch;
  const auto& rows = step_.rows;
  const auto& slots = step_.slots;
  const auto& order = step_.order;

  // Greedy on the device when every row samples plain greedy (no logprobs, processors or penalties
  // that would change the argmax): only the ids come back, and the CPU sampler is skipped.
  bool device_greedy = !rows.empty();
  for (const RowOwner& o : rows) {
    const State& s = states_.at(o.id);
    const SamplingParams& p = s.sampling->params;
    const auto num_output = static_cast<int64_t>(s.tokens.size()) - s.num_prompt_tokens;
    device_greedy &=
        o.sample && p.greedy() && !p.logprobs && p.logit_bias.empty() && p.repetition_penalty == 1.0 &&
        p.frequency_penalty == 0.0 && p.presence_penalty == 0.0 &&
        (num_output >= p.min_tokens || (s.sampling->eos_ids.empty() && p.stop_token_ids.empty()));
  }
  if (device_greedy) {
    ids_.resize(rows.size());
    model_.forward_argmax(b, kv_.views(), slots, ids_.data());
    for (size_t r = 0; r < rows.size(); ++r) result.sampled[rows[r].id].token = ids_[r];
  } else {
    sample_on_host(rows, b, slots, result);
  }
  // Advance the runner's own copy of each request.
  for (const auto& [id, num] : order) {
    State& s = states_.at(id);
    s.num_computed_tokens += num;
    auto it = result.sampled.find(id);
    if (it != result.sampled.end()) s.tokens.push_back(it->second.token);
  }
  return result;
}

void ModelRunner::sample_on_host(const std::vector<RowOwner>& rows, const ForwardBatch& b,
                                 const std::vector<const LoraAdapter*>& slots, StepResult& result) {
  const int64_t vocab = model_.config().vocab_size;
  logits_.resize(rows.size() * static_cast<size_t>(vocab));
  model_.forward(b, kv_.views(), slots, logits_.data());

  // Prompt logprobs first (sampling modifies rows in place), then one sampling call for the batch.
  std::vector<SamplerRow> sample_rows;
  std::vector<RequestId> sample_ids;
  for (size_t r = 0; r < rows.size(); ++r) {
    const RowOwner& o = rows[r];
    State& s = states_.at(o.id);
    float* row = logits_.data() + r * vocab;
    if (s.prompt_logprobs && o.position + 1 < s.num_prompt_tokens) {
      int64_t k = s.sampling->params.prompt_logprobs.value_or(0);
      SampleResult pl = Sampler::prompt_logprob(row, vocab, s.tokens[o.position + 1], k);
      LogprobEntry e{pl.token, pl.logprob, pl.rank, {}};
      for (const auto& t : pl.top) e.top.push_back({t.id, t.logprob});
      result.prompt_logprobs[o.id].emplace_back(o.position + 1, std::move(e));
    }
    if (o.sample) {
      const RequestSampling& info = *s.sampling;
      SamplerRow sr;
      sr.logits = row;
      sr.params = &info.params;
      sr.prompt_ids = std::span<const int32_t>(s.tokens.data(), static_cast<size_t>(s.num_prompt_tokens));
      sr.output_ids = std::span<const int32_t>(s.tokens.data() + s.num_prompt_tokens,
                                               s.tokens.size() - static_cast<size_t>(s.num_prompt_tokens));
      sr.eos_ids = info.eos_ids;
      sr.seed = info.seed;
      sample_rows.push_back(sr);
      sample_ids.push_back(o.id);
    }
  }
  std::vector<SampleResult> sampled = sampler_.sample(sample_rows);
  for (size_t i = 0; i < sampled.size(); ++i) {
    SampledToken t;
    t.token = sampled[i].token;
    if (states_.at(sample_ids[i]).sampling->params.logprobs) {
      LogprobEntry e{sampled[i].token, sampled[i].logprob, sampled[i].rank, {}};
      for (const auto& tk : sampled[i].top) e.top.push_back({tk.id, tk.logprob});
      t.logprob = std::move(e);
    }
    result.sampled[sample_ids[i]] = std::move(t);
  }
}

}  // namespace polylora
