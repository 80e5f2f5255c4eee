// worker/device_sampler.h: sampling where the logits are (the backend's memory), with the results of
// worker/sampler.h's Sampler: the same processing order, the same counter-based uniform, the same
// SampleResult. Only the sampled ids (and the log-probs asked for) come back to the host.
// Owns: the op's device scratch (4 * max_rows * vocab bytes for the processed logits, plus about 96 KB
// a row of histograms and candidate buffers), one device input buffer (with the rows' structured-output
// bitmasks, vocab / 8 bytes per constrained row), and two page-locked host staging areas
// with an event each, so that a launch can be queued while the previous one's copies are still in flight.
// Must not: keep request state between calls (everything arrives in DeviceSampleRow each launch), make
// scheduling decisions, or synchronize inside launch() (except to grow its input buffer when a step's
// edit lists outgrow every earlier one's).
//
// On the CUDA backend the work runs on the backend's stream (kernels/sampling/sampling_cuda.cu); on the
// CPU backend it runs at once on the calling thread through the same algorithm's host version
// (kernels::ref::sample), which gives identical results.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "api/sampling_params.h"
#include "backend/backend.h"
#include "kernels/sampling/sampling.h"
#include "worker/sampler.h"

namespace polylora {

// One row to sample: SamplerRow without the logits pointer (row r of a launch reads
// device_logits + r * vocab).
struct DeviceSampleRow {
  const SamplingParams* params = nullptr;
  std::span<const int32_t> prompt_ids;  // [prompt_len]: for the repetition penalty
  std::span<const int32_t> output_ids;  // [num_output] generated so far; its size is the output step
  std::span<const int32_t> eos_ids;     // masked under min_tokens (unless ignore_eos)
  uint64_t seed = 0;                    // the request's generator seed (assign_seed())
  // Prompt logprobs: sample nothing, report this token's raw log-prob and rank and the
  // params->prompt_logprobs best alternatives (Sampler::prompt_logprob with k = prompt_logprobs or 0).
  std::optional<int32_t> forced_token;
  // Structured output: [mask_words(vocab)] allowed-token bitmask (bit id set = id allowed), uploaded with
  // the launch's inputs and applied after the other processors; empty = no mask. Read during launch() only.
  std::span<const uint32_t> grammar_mask;
};

class DeviceSampler {
 public:
  // Allocates everything for batches of up to max_rows rows and up to max_top_logprobs alternatives
  // (kernels::kSampleMaxTop at most) once.
  DeviceSampler(Backend& backend, int64_t vocab, int64_t max_rows, int64_t max_top_logprobs);
  ~DeviceSampler();
  DeviceSampler(const DeviceSampler&) = delete;
  DeviceSampler& operator=(const DeviceSampler&) = delete;

  // Queues the sampling of rows.size() rows of device_logits ([rows, vocab] f32 in backend memory, read
  // only) on the backend's stream and returns without waiting for it. May be called again before
  // wait(): the earlier launch's results are then dropped. Throws polylora::Error (nothing queued) for
  // token ids outside the vocabulary (where the CPU sampler's CHECK aborts) or more logprobs than
  // max_top_logprobs.
  // Returns a ticket for wait(ticket): the results of the last two launches stay available.
  int launch(const float* device_logits, std::span<const DeviceSampleRow> rows);
  // The sampled ids of the last launch, [rows] int32 in backend memory: valid for work queued on the
  // backend after launch() and before the next launch() (e.g. to feed them to the next step).
  const int32_t* device_ids() const { return out_; }
  // Waits for the last launch's results (its event only) and returns one SampleResult per row, as
  // Sampler::sample / Sampler::prompt_logprob fill them (logprob, rank and top only when asked). Empty
  // before the first launch; the same results again when called twice.
  std::vector<SampleResult> wait();
  // The same for one of the last two launches (its ticket): a step queued ahead of the one completed.
  std::vector<SampleResult> wait(int ticket);

  // CUDA: run the op as one cooperative kernel (the default) or as a kernel per phase (the same results;
  // for tests and benchmarks).
  void set_fused_kernel(bool fused) { fused_ = fused; }

  int64_t vocab_size() const { return vocab_; }
  int64_t max_rows() const { return max_rows_; }
  int64_t max_top_logprobs() const { return max_top_; }
  // Backend memory held (scratch, input and output buffers).
  size_t device_bytes() const { return scratch_bytes_ + in_bytes_ + out_bytes_; }

 private:
  struct RowMeta {
    bool want_logprobs = false;
  };
  struct Slot {
    void* pinned_in = nullptr;  // host staging of the launch's inputs (params, states, edits, biases)
    size_t in_capacity = 0;
    int32_t* pinned_out = nullptr;  // host copy of the packed results
    void* event = nullptr;          // recorded after the results' copy
    bool in_flight = false;
    int64_t rows = 0;
    std::vector<RowMeta> meta;
  };
  struct HostEdit {
    int32_t token;
    int32_t flags;
    int32_t count;
  };

  // Appends row r's params, initial state, edits and biases to the host vectors.
  void build_row(const DeviceSampleRow& row);
  HostEdit& edit_for(int32_t id);
  void check_id(int32_t id) const;

  Backend& be_;
  int64_t vocab_;
  int64_t max_rows_;
  int64_t max_top_;
  kernels::SampleShape shape_;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  int32_t* out_ = nullptr;  // packed results (kernels::sample_out_layout), ids first
  size_t out_bytes_ = 0;
  void* in_ = nullptr;  // device copy of a launch's inputs
  size_t in_bytes_ = 0;
  bool fused_ = true;
  Slot slots_[2];
  int next_slot_ = 0;
  int last_slot_ = -1;

  // Host scratch of one launch.
  std::vector<kernels::SampleRowParams> params_;
  std::vector<kernels::SampleRowState> states_;
  std::vector<kernels::SampleEdit> edits_;
  std::vector<float> biases_;
  std::vector<int32_t> edit_of_;  // [vocab] index into row_edits_ or -1; all -1 between rows
  std::vector<HostEdit> row_edits_;
  std::vector<std::pair<int32_t, float>> row_biases_;
  std::vector<std::span<const uint32_t>> masks_;  // the launch's rows' masks, by mask_row
};

}  // namespace polylora
