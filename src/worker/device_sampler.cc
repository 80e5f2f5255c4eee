// worker/device_sampler.cc: DeviceSampler: SamplingParams -> per-row kernel params and logit edits (on the
// host, O(prompt + output + bias + stop ids) per row, as the CPU sampler's own processing; structured-output
// bitmasks copied as they are), one upload,
// the backend's sampling op, one download of the packed results, double-buffered host staging.
#include "worker/device_sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/error.h"

namespace polylora {
namespace {

namespace k = kernels;

size_t align16(size_t n) {
  return (n + 15) / 16 * 16;
}

// Where the sections of one launch's inputs lie in the staging and device buffers.
struct InputLayout {
  size_t params = 0, states = 0, edits = 0, biases = 0, masks = 0, bytes = 0;
};
InputLayout input_layout(size_t rows, size_t edits, size_t biases, size_t mask_bytes = 0) {
  InputLayout l;
  l.params = 0;
  l.states = align16(l.params + rows * sizeof(k::SampleRowParams));
  l.edits = align16(l.states + rows * sizeof(k::SampleRowState));
  l.biases = align16(l.edits + edits * sizeof(k::SampleEdit));
  l.masks = align16(l.biases + biases * sizeof(float));
  l.bytes = align16(l.masks + mask_bytes);
  return l;
}

}  // namespace

DeviceSampler::DeviceSampler(Backend& backend, int64_t vocab, int64_t max_rows, int64_t max_top_logprobs)
    : be_(backend), vocab_(vocab), max_rows_(max_rows), max_top_(max_top_logprobs) {
  CHECK_MSG(vocab > 0 && vocab <= k::kSampleMaxVocab, "DeviceSampler: vocabulary size {} out of range",
            vocab);
  CHECK_MSG(max_rows > 0 && max_rows <= 65535, "DeviceSampler: max_rows {} out of range", max_rows);
  CHECK_MSG(max_top_logprobs >= 0 && max_top_logprobs <= k::kSampleMaxTop,
            "DeviceSampler: max_top_logprobs {} out of range (at most {})", max_top_logprobs,
            k::kSampleMaxTop);
  shape_ = {max_rows, vocab, max_top_logprobs};
  scratch_bytes_ = k::sample_scratch_bytes(shape_);
  scratch_ = be_.alloc(scratch_bytes_);  // zeroed, as the op requires
  out_bytes_ = static_cast<size_t>(k::sample_out_layout(max_rows, max_top_logprobs).words) * sizeof(int32_t);
  out_ = static_cast<int32_t*>(be_.alloc(out_bytes_));
  // Inputs sized for full batches with a few hundred edits per row; grown when a launch needs more.
  in_bytes_ = input_layout(static_cast<size_t>(max_rows), static_cast<size_t>(max_rows) * 256, 1024).bytes;
  in_ = be_.alloc(in_bytes_);
  for (Slot& s : slots_) {
    s.in_capacity = in_bytes_;
    s.pinned_in = be_.alloc_host(s.in_capacity);
    s.pinned_out = static_cast<int32_t*>(be_.alloc_host(out_bytes_));
    s.event = be_.create_event();
  }
  edit_of_.assign(static_cast<size_t>(vocab), -1);
}

DeviceSampler::~DeviceSampler() {
  // Nothing queued may still use the buffers (free / free_host synchronize on CUDA).
  be_.synchronize();
  for (Slot& s : slots_) {
    be_.destroy_event(s.event);
    be_.free_host(s.pinned_in);
    be_.free_host(s.pinned_out);
  }
  be_.free(in_);
  be_.free(out_);
  be_.free(scratch_);
}

void DeviceSampler::check_id(int32_t id) const {
  if (id < 0 || id >= vocab_) fail("token id {} outside the vocabulary (size {})", id, vocab_);
}

DeviceSampler::HostEdit& DeviceSampler::edit_for(int32_t id) {
  int32_t& at = edit_of_[static_cast<size_t>(id)];
  if (at < 0) {
    at = static_cast<int32_t>(row_edits_.size());
    row_edits_.push_back({id, 0, 0});
  }
  return row_edits_[static_cast<size_t>(at)];
}

void DeviceSampler::build_row(const DeviceSampleRow& row) {
  CHECK_MSG(row.params != nullptr, "DeviceSampler: a row has no SamplingParams");
  const SamplingParams& sp = *row.params;
  k::SampleRowParams p;
  p.edit_begin = p.edit_end = static_cast<int32_t>(edits_.size());
  auto top_count = [&](int64_t asked) {
    if (asked > max_top_)
      fail("{} log-probs asked per token, but the device sampler keeps at most {} (max_top_logprobs)", asked,
           max_top_);
    return static_cast<int32_t>(std::clamp<int64_t>(asked, 0, vocab_));
  };

  if (!row.grammar_mask.empty() && !row.forced_token) {
    if (row.grammar_mask.size() * 32 < static_cast<size_t>(vocab_))
      fail("a grammar mask of {} words does not cover the vocabulary ({} tokens)", row.grammar_mask.size(),
           vocab_);
    p.mask_row = static_cast<int32_t>(masks_.size());
    masks_.push_back(row.grammar_mask);
  }
  if (row.forced_token) {
    check_id(*row.forced_token);
    p.mode = static_cast<int32_t>(k::SampleMode::kForced);
    p.forced_token = *row.forced_token;
    p.want_logprobs = 1;
    p.num_top = top_count(sp.prompt_logprobs.value_or(0));
    params_.push_back(p);
    states_.push_back(k::init_sample_row_state(p, vocab_));
    return;
  }

  const auto num_output = static_cast<int64_t>(row.output_ids.size());
  p.mode = static_cast<int32_t>(sp.greedy() ? k::SampleMode::kGreedy : k::SampleMode::kRandom);
  if (sp.logprobs) {
    p.want_logprobs = 1;
    p.num_top = top_count(*sp.logprobs);
  }

  // Edits, in the CPU sampler's checks and order (applied per token on the device). edit_of_ is back to
  // all -1 when this block is left, also by an exception.
  row_edits_.clear();
  row_biases_.clear();
  struct ResetEditIndex {
    DeviceSampler* self;
    ~ResetEditIndex() {
      for (const HostEdit& e : self->row_edits_) self->edit_of_[static_cast<size_t>(e.token)] = -1;
    }
  } reset{this};
  if (num_output < sp.min_tokens) {
    for (int32_t id : sp.stop_token_ids) {
      check_id(id);
      edit_for(id).flags |= k::kEditMask;
    }
    if (!sp.ignore_eos) {
      for (int32_t id : row.eos_ids) {
        check_id(id);
        edit_for(id).flags |= k::kEditMask;
      }
    }
  }
  for (const auto& [id, bias] : sp.logit_bias) {
    check_id(id);
    edit_for(id);
    row_biases_.emplace_back(id, static_cast<float>(bias));
  }
  const bool use_rep = sp.repetition_penalty != 1.0;
  const bool use_freq = sp.frequency_penalty != 0.0;
  const bool use_pres = sp.presence_penalty != 0.0;
  if (use_rep || use_freq || use_pres) {
    for (int32_t id : row.output_ids) {
      check_id(id);
      ++edit_for(id).count;
    }
    if (use_rep) {
      for (int32_t id : row.prompt_ids) {
        check_id(id);
        edit_for(id).flags |= k::kEditRepeat;
      }
      for (int32_t id : row.output_ids) edit_for(id).flags |= k::kEditRepeat;
    }
    p.penalty_flags = (use_rep ? k::kPenaltyRepetition : 0) | (use_freq ? k::kPenaltyFrequency : 0) |
                      (use_pres ? k::kPenaltyPresence : 0);
    p.repetition_penalty = static_cast<float>(sp.repetition_penalty);
    p.frequency_penalty = static_cast<float>(sp.frequency_penalty);
    p.presence_penalty = static_cast<float>(sp.presence_penalty);
  }
  std::sort(row_edits_.begin(), row_edits_.end(),
            [](const HostEdit& a, const HostEdit& b) { return a.token < b.token; });
  // Biases of one token stay in list order (they are added one after the other).
  std::stable_sort(row_biases_.begin(), row_biases_.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  size_t bi = 0;
  for (const HostEdit& e : row_edits_) {
    k::SampleEdit out;
    out.token = e.token;
    out.flags = e.flags;
    out.count = e.count;
    out.bias_begin = static_cast<int32_t>(biases_.size());
    while (bi < row_biases_.size() && row_biases_[bi].first == e.token)
      biases_.push_back(row_biases_[bi++].second);
    out.bias_end = static_cast<int32_t>(biases_.size());
    edits_.push_back(out);
  }
  p.edit_end = static_cast<int32_t>(edits_.size());

  if (p.mode == static_cast<int32_t>(k::SampleMode::kRandom)) {
    p.temperature = static_cast<float>(sp.temperature);
    const bool use_top_k = sp.top_k > 0 && sp.top_k < vocab_;
    const bool use_min_p = sp.min_p > 0.0;
    p.top_k = use_top_k ? static_cast<int32_t>(sp.top_k) : 0;
    p.log_min_p = use_min_p ? std::log(sp.min_p) : -std::numeric_limits<double>::infinity();
    p.top_p = sp.top_p;
    p.filtered = use_top_k || use_min_p || sp.top_p < 1.0;
    p.seed = row.seed;
    p.step = num_output;
  }
  params_.push_back(p);
  states_.push_back(k::init_sample_row_state(p, vocab_));
}

int DeviceSampler::launch(const float* device_logits, std::span<const DeviceSampleRow> rows) {
  const auto n = static_cast<int64_t>(rows.size());
  CHECK_MSG(n <= max_rows_, "DeviceSampler: {} rows, but it was made for at most {}", n, max_rows_);
  Slot& slot = slots_[next_slot_];
  if (slot.in_flight) {  // the launch before the last one: long done in practice
    be_.wait_event(slot.event);
    slot.in_flight = false;
  }
  params_.clear();
  states_.clear();
  edits_.clear();
  biases_.clear();
  masks_.clear();
  slot.meta.clear();
  for (const DeviceSampleRow& row : rows) {
    build_row(row);
    slot.meta.push_back({params_.back().want_logprobs != 0});
  }
  slot.rows = n;
  last_slot_ = next_slot_;
  next_slot_ ^= 1;
  if (n == 0) return last_slot_;

  const size_t mask_words = static_cast<size_t>((vocab_ + 31) / 32);
  const InputLayout l =
      input_layout(params_.size(), edits_.size(), biases_.size(), masks_.size() * mask_words * sizeof(uint32_t));
  if (l.bytes > slot.in_capacity) {
    be_.free_host(slot.pinned_in);
    slot.in_capacity = l.bytes + l.bytes / 2;
    slot.pinned_in = be_.alloc_host(slot.in_capacity);
  }
  if (l.bytes > in_bytes_) {
    be_.free(in_);  // waits for queued work that may still read it
    in_bytes_ = l.bytes + l.bytes / 2;
    in_ = be_.alloc(in_bytes_);
  }
  auto* staging = static_cast<char*>(slot.pinned_in);
  std::memcpy(staging + l.params, params_.data(), params_.size() * sizeof(k::SampleRowParams));
  std::memcpy(staging + l.states, states_.data(), states_.size() * sizeof(k::SampleRowState));
  if (!edits_.empty()) std::memcpy(staging + l.edits, edits_.data(), edits_.size() * sizeof(k::SampleEdit));
  if (!biases_.empty()) std::memcpy(staging + l.biases, biases_.data(), biases_.size() * sizeof(float));
  for (size_t m = 0; m < masks_.size(); ++m)
    std::memcpy(staging + l.masks + m * mask_words * sizeof(uint32_t), masks_[m].data(),
                mask_words * sizeof(uint32_t));
  be_.copy_to_device_async(in_, staging, l.bytes);

  auto* dev = static_cast<char*>(in_);
  k::SampleArgs args;
  args.logits = device_logits;
  args.ld = vocab_;
  args.rows = n;
  args.shape = shape_;
  args.params = reinterpret_cast<const k::SampleRowParams*>(dev + l.params);
  args.state = reinterpret_cast<k::SampleRowState*>(dev + l.states);
  args.edits = reinterpret_cast<const k::SampleEdit*>(dev + l.edits);
  args.biases = reinterpret_cast<const float*>(dev + l.biases);
  args.masks = masks_.empty() ? nullptr : reinterpret_cast<const uint32_t*>(dev + l.masks);
  args.mask_words = static_cast<int64_t>(mask_words);
  args.num_rounds = k::sample_num_rounds(params_.data(), n);
  args.any_random = std::any_of(params_.begin(), params_.end(), [](const k::SampleRowParams& p) {
    return p.mode == static_cast<int32_t>(k::SampleMode::kRandom);
  });
  args.fused = fused_;
  args.scratch = scratch_;
  args.out = out_;
  be_.sample(args);

  const bool any_logprobs =
      std::any_of(slot.meta.begin(), slot.meta.end(), [](const RowMeta& m) { return m.want_logprobs; });
  const int64_t words = any_logprobs ? k::sample_out_layout(n, max_top_).words : n;
  be_.copy_to_host_async(slot.pinned_out, out_, static_cast<size_t>(words) * sizeof(int32_t));
  be_.record_event(slot.event);
  slot.in_flight = true;
  return last_slot_;
}

std::vector<SampleResult> DeviceSampler::wait() {
  if (last_slot_ < 0) return {};
  return wait(last_slot_);
}

std::vector<SampleResult> DeviceSampler::wait(int ticket) {
  CHECK_MSG(ticket == 0 || ticket == 1, "DeviceSampler::wait: bad ticket {}", ticket);
  Slot& slot = slots_[ticket];
  if (slot.in_flight) {
    be_.wait_event(slot.event);
    slot.in_flight = false;
  }
  const int64_t n = slot.rows;
  const k::SampleOutLayout l = k::sample_out_layout(n, max_top_);
  const int32_t* out = slot.pinned_out;
  auto as_float = [](int32_t bits) {
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  };
  std::vector<SampleResult> results(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) {
    SampleResult& res = results[static_cast<size_t>(r)];
    res.token = out[l.ids + r];
    if (!slot.meta[static_cast<size_t>(r)].want_logprobs) continue;
    res.logprob = as_float(out[l.logprob + r]);
    res.rank = out[l.rank + r];
    const int32_t num_top = out[l.num_top + r];
    res.top.reserve(static_cast<size_t>(num_top));
    for (int32_t j = 0; j < num_top; ++j)
      res.top.push_back(
          {out[l.top_ids + r * max_top_ + j], as_float(out[l.top_logprobs + r * max_top_ + j])});
  }
  return results;
}

}  // namespace polylora
