// runtime/cuda/nccl_communicator.h: the Communicator (runtime/communicator.h) of one GPU rank over NCCL,
// and a group of them for the GPUs of one process (docs/tensor-parallel.md). Built only when the CUDA
// toolkit ships NCCL (nccl.h and libnccl; src/runtime/cuda/CMakeLists.txt defines POLYLORA_HAVE_NCCL).
// Owns: the ncclComm_t of a rank, its CUDA device and stream, a small device scratch for barrier(), and
// the group's shared abort state. NVLink multicast (NVLS) stays off: NCCL_NVLS_ENABLE=0 is put in the
// environment before the first communicator is made, unless the caller set it.
// Differences from the CPU group (the interface's semantics otherwise hold):
// - Buffers are device memory of the rank's device. A collective is queued on the rank's stream and
//   returns without waiting: its output is ready for later work on that stream, and for the host after
//   synchronize() (or with set_synchronous(true), which waits after every collective).
// - Sums and maxima are NCCL's: the order in which ranks are combined is NCCL's (ring or tree), and F16 /
//   BF16 are accumulated in their own type, so results may differ from the CPU group's serial rank-order
//   loop in the last bits (exactly equal at one rank); NaN handling of kMax is NCCL's.
// - Mismatched collectives between ranks are not detected (NCCL hangs or corrupts); the arguments this
//   rank can check alone (dtype, root, count lists, overlapping buffers) are, and a failure aborts the
//   group: every later call on any of its ranks throws polylora::Error with the same message.
// Must not: know about models, shards or the engine; allocate per collective.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "runtime/communicator.h"

namespace polylora {

// An NCCL unique id (ncclUniqueId's 128 bytes), made by one rank and given to all of them.
struct NcclId {
  std::array<char, 128> bytes{};
};
NcclId make_nccl_id();

// The abort state the ranks of one group share (a group made by NcclCommunicatorGroup, or ranks made one
// by one with the same `shared`).
struct NcclAbortState;

class NcclCommunicator : public Communicator {
 public:
  // Joins the group `id` as rank `rank` of `size` on CUDA device `device`, queuing on `stream` (a stream of
  // that device; nullptr: the legacy default stream). Every rank must call this at the same time (other
  // threads or processes): ncclCommInitRank waits for all of them. `shared` (optional) ties ranks of one
  // process into one abort state.
  NcclCommunicator(const NcclId& id, int rank, int size, int device, cudaStream_t stream,
                   std::shared_ptr<NcclAbortState> shared = nullptr);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }

  void all_reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override;
  void all_gather(const void* send, void* recv, size_t count, DType dtype) override;
  void reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override;
  void broadcast(void* buf, size_t count, DType dtype, int root) override;
  // ncclSend / ncclRecv to and from every rank with a non-zero count, in one NCCL group.
  void all_to_all_v(const void* send, std::span<const size_t> send_counts, void* recv,
                    std::span<const size_t> recv_counts, DType dtype) override;
  // An all_reduce of one int on the stream, then a wait for the stream.
  void barrier() override;
  // Marks the group aborted (every later call on any of its ranks throws Error naming this rank and
  // `reason`) and aborts this rank's NCCL communicator (ncclCommAbort: its queued collectives end).
  void abort(std::string_view reason) override;

  // Waits for every collective queued on the stream; throws Error if NCCL reported one failed.
  void synchronize();
  void set_synchronous(bool on) { synchronous_ = on; }

 private:
  friend class NcclCommunicatorGroup;
  struct Adopt {};
  // A rank around an initialized ncclComm_t (NcclCommunicatorGroup's ncclCommInitAll).
  NcclCommunicator(Adopt, void* comm, int rank, int size, int device, cudaStream_t stream,
                   std::shared_ptr<NcclAbortState> shared);
  void init_rest();              // the scratch and the abort state
  void enter(const char* what);  // throws when the group is aborted; makes device_ current
  void leave();                  // waits when synchronous
  [[noreturn]] void fail_group(const std::string& message);
  void check(int result, const char* call);  // an ncclResult_t

  int rank_ = 0, size_ = 1, device_ = 0;
  cudaStream_t stream_ = nullptr;
  void* comm_ = nullptr;    // ncclComm_t
  int* scratch_ = nullptr;  // barrier's one int (device memory)
  bool synchronous_ = false;
  bool comm_aborted_ = false;
  std::shared_ptr<NcclAbortState> shared_;
};

// N ranks on N GPUs of this process (ncclCommInitAll from the calling thread), each with a non-blocking
// stream of its own; communicator(r) is used by one thread at a time. With several ranks, each must be
// driven by its own thread (a collective of one rank waits on the GPU for the others').
class NcclCommunicatorGroup {
 public:
  explicit NcclCommunicatorGroup(std::span<const int> devices);
  // The same, rank r queuing on streams[r] (a stream of devices[r], owned by the caller and outliving the
  // group): a model's ranks put their collectives on their backends' streams, in order with their ops.
  NcclCommunicatorGroup(std::span<const int> devices, std::span<cudaStream_t const> streams);
  ~NcclCommunicatorGroup();
  NcclCommunicatorGroup(const NcclCommunicatorGroup&) = delete;
  NcclCommunicatorGroup& operator=(const NcclCommunicatorGroup&) = delete;

  int size() const { return static_cast<int>(ranks_.size()); }
  NcclCommunicator& communicator(int rank) { return *ranks_.at(static_cast<size_t>(rank)); }
  // Aborts every rank (the server stopping): later calls throw Error naming `reason`.
  void shutdown(std::string_view reason);

 private:
  std::vector<cudaStream_t> streams_;  // the streams the group made (destroyed with it)
  std::vector<std::unique_ptr<NcclCommunicator>> ranks_;
};

}  // namespace polylora
