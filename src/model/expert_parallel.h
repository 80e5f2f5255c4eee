// model/expert_parallel.h: the host buffers one rank reuses for expert parallelism's dispatch and combine
// (model/expert_parallel.cc, Model::moe_expert_parallel). Plain data.
// Must not: run kernels or collectives, or know about adapters.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace polylora {

struct ExpertParallelScratch {
  std::vector<size_t> pairs;  // [src rank][dst rank]: token-expert pairs of src's tokens for dst's experts
  std::vector<size_t> send_counts, recv_counts;  // [rank], in floats (pairs · hidden)
  std::vector<int64_t> sent;        // [pairs sent]: t · top_k + k of each row sent, in send order
  std::vector<int64_t> back_row;    // [this rank's tokens · top_k]: the combined row of each of its pairs
  std::vector<float> send, recv;    // rows dispatched [pairs, hidden]: out, in
  std::vector<int32_t> ids, slots;  // [pairs received]: local expert and adapter slot of each
  std::vector<float> ones;          // [pairs received]: weight 1 (the source applies the router's weight)
  std::vector<float> expert_out,
      back;  // rows of the local experts [received, hidden], returned [sent, hidden]
};

}  // namespace polylora
