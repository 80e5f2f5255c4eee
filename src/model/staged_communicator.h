// model/staged_communicator.h: a Communicator (runtime/communicator.h) over buffers in a backend's memory
// that runs each collective through host memory on another communicator (a CPU group's rank): wait for
// the backend, copy the inputs to the host, run the collective there, copy the results back. Tensor
// parallelism uses it on GPUs when NCCL cannot: several ranks on one GPU (tests of the sharded code path on
// one device; NCCL refuses two ranks on one GPU) or a build without NCCL (docs/tensor-parallel.md).
// Synchronous (so a CUDA graph cannot hold it) and slow: a correctness path. The host group's semantics
// hold (rank-order sums, mismatches detected, one rank's failure aborts all).
// Must not: know about models or shards.
#pragma once

#include <cstddef>
#include <vector>

#include "backend/backend.h"
#include "runtime/communicator.h"

namespace polylora {

class StagedCommunicator final : public Communicator {
 public:
  // host: this rank's communicator of a host group (outlives this); be: the backend whose memory the
  // buffers are in.
  StagedCommunicator(Communicator& host, Backend& be) : host_(host), be_(be) {}

  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  void all_reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override;
  void all_gather(const void* send, void* recv, size_t count, DType dtype) override;
  void reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override;
  void broadcast(void* buf, size_t count, DType dtype, int root) override;
  void all_to_all_v(const void* send, std::span<const size_t> send_counts, void* recv,
                    std::span<const size_t> recv_counts, DType dtype) override;
  void barrier() override { host_.barrier(); }
  void abort(std::string_view reason) override { host_.abort(reason); }

 private:
  // `bytes` of backend memory at src into send_ (after everything queued on the backend).
  void down(const void* src, size_t bytes);
  void up(void* dst, size_t bytes);  // recv_'s first `bytes` to backend memory

  Communicator& host_;
  Backend& be_;
  std::vector<std::byte> send_, recv_;
};

}  // namespace polylora
