// runtime/communicator.h: collectives between the ranks of a tensor-parallel group, and a CPU group of them.
// Owns: the Communicator interface (one object per rank, named and shaped like NCCL's collectives) and
// CpuCommunicatorGroup, N communicators sharing state for N threads of one process (docs/tensor-parallel.md).
// Must not: know about models, shards or the engine; allocate per call beyond a shared scratch that grows.
//
// Semantics every implementation keeps:
// - Every rank calls the same collectives, with matching arguments, in the same order. `count` is in
//   elements of `dtype`; buffers are host or device memory as the implementation says (CPU: host).
// - Reductions (kSum, kMax) combine ranks in rank order (r0, r1, ...), accumulating F16 and BF16 in f32 and
//   rounding once at the end, so every rank gets bit-identical results. kMax propagates NaN.
// - A collective returns once this rank's output is written and no other rank reads its input any more:
//   the caller may reuse its buffers right after.
// - A failure (mismatched collectives or counts, bad arguments, abort()) aborts the whole group: every
//   rank in or entering a collective gets polylora::Error with the same message, and so does every later
//   call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/dtype.h"

namespace polylora {

enum class ReduceOp : uint8_t { kSum, kMax };

std::string_view reduce_op_name(ReduceOp op);

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // recv[i] = op over ranks of send[i], i < count. send == recv (in place) is allowed. Reduction dtypes:
  // F32, F16, BF16, I32, I64 (integer sums wrap).
  virtual void all_reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) = 0;
  // recv (size() * count elements) = the ranks' send buffers (count each) concatenated in rank order.
  // In place when send == recv + rank() * count.
  virtual void all_gather(const void* send, void* recv, size_t count, DType dtype) = 0;
  // recv (count elements) = op over ranks of their send[rank() * count + i] (send: size() * count
  // elements). In place when recv == send + rank() * count.
  virtual void reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) = 0;
  // buf (count elements) on every rank = buf of `root`.
  virtual void broadcast(void* buf, size_t count, DType dtype, int root) = 0;
  // send holds size() segments in rank order, send_counts[j] elements for rank j; recv holds size()
  // segments in rank order, recv_counts[i] elements from rank i. Rank i's send_counts[j] must equal rank
  // j's recv_counts[i]. Counts may be zero; send and recv must not overlap.
  virtual void all_to_all_v(const void* send, std::span<const size_t> send_counts, void* recv,
                            std::span<const size_t> recv_counts, DType dtype) = 0;
  virtual void barrier() = 0;

  // Aborts the group: the other ranks' pending and later collectives throw Error naming this rank and
  // `reason`. Returns without waiting; call it when this rank will not reach its next collective.
  virtual void abort(std::string_view reason) = 0;
};

// Aborts `comm` when destroyed during stack unwinding, so that a rank whose own code throws between
// collectives releases the others instead of leaving them waiting:
//   AbortOnUnwind guard(comm);  ...work and collectives...
class AbortOnUnwind {
 public:
  explicit AbortOnUnwind(Communicator& comm) : comm_(comm), exceptions_(std::uncaught_exceptions()) {}
  ~AbortOnUnwind() {
    if (std::uncaught_exceptions() > exceptions_) comm_.abort("it threw an exception");
  }
  AbortOnUnwind(const AbortOnUnwind&) = delete;
  AbortOnUnwind& operator=(const AbortOnUnwind&) = delete;

 private:
  Communicator& comm_;
  int exceptions_;
};

// N communicators for N threads of one process, one rank each (communicator(r) for the thread of rank r).
// Collectives are rendezvous under one mutex and condition variable: the last rank to arrive checks that
// all ranks called the same collective with consistent arguments, then every rank copies (or reduces its
// 1/N of the elements) straight from the others' buffers. No timeouts: a rank that will not come calls
// abort(), or the owner calls shutdown(). The group must outlive the threads using it.
class CpuCommunicatorGroup {
 public:
  explicit CpuCommunicatorGroup(int size);
  ~CpuCommunicatorGroup();
  CpuCommunicatorGroup(const CpuCommunicatorGroup&) = delete;
  CpuCommunicatorGroup& operator=(const CpuCommunicatorGroup&) = delete;

  int size() const;
  Communicator& communicator(int rank);
  // Aborts the group from outside its ranks (e.g. the server stopping): waiting ranks throw Error.
  void shutdown(std::string_view reason);
  bool aborted() const;

  struct State;

 private:
  std::unique_ptr<State> state_;
  std::vector<std::unique_ptr<Communicator>> communicators_;
};

}  // namespace polylora
