// runtime/cuda/nccl_communicator.cc: see nccl_communicator.h.
#include "runtime/cuda/nccl_communicator.h"

#include <nccl.h>

#include <cstdlib>
#include <cstring>
#include <mutex>

#include "common/error.h"

namespace polylora {

struct NcclAbortState {
  std::mutex mu;
  bool aborted = false;
  std::string message;
};

namespace {

ncclComm_t as_comm(void* c) {
  return static_cast<ncclComm_t>(c);
}

// NVLink multicast (NVLS) stays off (docs/tensor-parallel.md); a value the caller set is kept.
void disable_nvls() {
  ::setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
}

void check_cuda(cudaError_t e, const char* call) {
  if (e != cudaSuccess) fail("NCCL communicator: {} failed: {}", call, cudaGetErrorString(e));
}

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kF16:
      return ncclFloat16;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kI32:
      return ncclInt32;
    case DType::kI64:
      return ncclInt64;
    case DType::kU8:
      return ncclUint8;
    case DType::kI8:
      return ncclInt8;
  }
  fail("NCCL communicator: unknown dtype {}", static_cast<int>(dtype));
}

// The reductions of the CPU group: F32, F16, BF16, I32, I64.
bool reducible(DType dtype) {
  switch (dtype) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kI32:
    case DType::kI64:
      return true;
    case DType::kU8:
    case DType::kI8:
      return false;
  }
  return false;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kMax:
      return ncclMax;
  }
  fail("NCCL communicator: unknown reduction {}", static_cast<int>(op));
}

// Whether byte ranges [a, a + na) and [b, b + nb) overlap (empty ranges never do).
bool overlap(const void* a, size_t na, const void* b, size_t nb) {
  if (na == 0 || nb == 0) return false;
  const auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return pa < pb + nb && pb < pa + na;
}

}  // namespace

NcclId make_nccl_id() {
  disable_nvls();
  ncclUniqueId id;
  const ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) fail("NCCL communicator: ncclGetUniqueId failed: {}", ncclGetErrorString(r));
  static_assert(sizeof(id) == sizeof(NcclId::bytes));
  NcclId out;
  std::memcpy(out.bytes.data(), &id, sizeof(id));
  return out;
}

NcclCommunicator::NcclCommunicator(const NcclId& id, int rank, int size, int device, cudaStream_t stream,
                                   std::shared_ptr<NcclAbortState> shared)
    : rank_(rank), size_(size), device_(device), stream_(stream), shared_(std::move(shared)) {
  if (size < 1 || rank < 0 || rank >= size)
    fail("NCCL communicator: rank {} of a group of {} does not exist", rank, size);
  disable_nvls();
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  ncclUniqueId uid;
  std::memcpy(&uid, id.bytes.data(), sizeof(uid));
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRank(&comm, size, uid, rank);
  if (r != ncclSuccess)
    fail("NCCL communicator: ncclCommInitRank (rank {} of {}, device {}) failed: {}", rank, size, device,
         ncclGetErrorString(r));
  comm_ = comm;
  init_rest();
}

NcclCommunicator::NcclCommunicator(Adopt, void* comm, int rank, int size, int device, cudaStream_t stream,
                                   std::shared_ptr<NcclAbortState> shared)
    : rank_(rank), size_(size), device_(device), stream_(stream), comm_(comm), shared_(std::move(shared)) {
  init_rest();
}

void NcclCommunicator::init_rest() {
  if (!shared_) shared_ = std::make_shared<NcclAbortState>();
  check_cuda(cudaSetDevice(device_), "cudaSetDevice");
  check_cuda(cudaMalloc(&scratch_, sizeof(int)), "cudaMalloc");
}

NcclCommunicator::~NcclCommunicator() {
  cudaSetDevice(device_);
  if (comm_) {
    if (comm_aborted_) {
      // ncclCommAbort already freed it
    } else {
      cudaStreamSynchronize(stream_);
      ncclCommDestroy(as_comm(comm_));
    }
  }
  if (scratch_) cudaFree(scratch_);
}

void NcclCommunicator::fail_group(const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    if (!shared_->aborted) {
      shared_->aborted = true;
      shared_->message = message;
    }
  }
  if (comm_ && !comm_aborted_) {
    ncclCommAbort(as_comm(comm_));
    comm_aborted_ = true;
  }
  std::string m;
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    m = shared_->message;
  }
  throw Error(m);
}

void NcclCommunicator::check(int result, const char* call) {
  const auto r = static_cast<ncclResult_t>(result);
  if (r == ncclSuccess) return;
  const char* last = comm_ ? ncclGetLastError(as_comm(comm_)) : nullptr;
  fail_group(fmt::format("NCCL communicator rank {} of {}: {} failed: {}{}{}", rank_, size_, call,
                         ncclGetErrorString(r), last && *last ? ": " : "", last ? last : ""));
}

void NcclCommunicator::enter(const char* what) {
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    if (shared_->aborted) {
      const std::string m = shared_->message;
      if (comm_ && !comm_aborted_) {
        ncclCommAbort(as_comm(comm_));
        comm_aborted_ = true;
      }
      throw Error(m);
    }
  }
  const cudaError_t e = cudaSetDevice(device_);
  if (e != cudaSuccess)
    fail_group(fmt::format("NCCL communicator rank {} of {}: {}: cudaSetDevice({}) failed: {}", rank_, size_,
                           what, device_, cudaGetErrorString(e)));
}

void NcclCommunicator::leave() {
  if (synchronous_) synchronize();
}

void NcclCommunicator::synchronize() {
  enter("synchronize");
  const cudaError_t e = cudaStreamSynchronize(stream_);
  if (e != cudaSuccess)
    fail_group(fmt::format("NCCL communicator rank {} of {}: cudaStreamSynchronize failed: {}", rank_, size_,
                           cudaGetErrorString(e)));
  ncclResult_t async = ncclSuccess;
  check(ncclCommGetAsyncError(as_comm(comm_), &async), "ncclCommGetAsyncError");
  check(async, "a queued collective");
}

void NcclCommunicator::all_reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) {
  enter("all_reduce");
  if (!reducible(dtype))
    fail_group(fmt::format("NCCL communicator rank {} of {}: all_reduce of {}: no reduction for this dtype",
                           rank_, size_, dtype_name(dtype)));
  if (count > 0 && (!send || !recv))
    fail_group(fmt::format("NCCL communicator rank {} of {}: all_reduce with a null buffer", rank_, size_));
  const size_t bytes = count * dtype_size(dtype);
  if (send != recv && overlap(send, bytes, recv, bytes))
    fail_group(
        fmt::format("NCCL communicator rank {} of {}: all_reduce buffers overlap partially", rank_, size_));
  check(ncclAllReduce(send, recv, count, nccl_type(dtype), nccl_op(op), as_comm(comm_), stream_),
        "ncclAllReduce");
  leave();
}

void NcclCommunicator::all_gather(const void* send, void* recv, size_t count, DType dtype) {
  enter("all_gather");
  if (count > 0 && (!send || !recv))
    fail_group(fmt::format("NCCL communicator rank {} of {}: all_gather with a null buffer", rank_, size_));
  const size_t bytes = count * dtype_size(dtype);
  const void* in_place = static_cast<const char*>(recv) + static_cast<size_t>(rank_) * bytes;
  if (send != in_place && overlap(send, bytes, recv, bytes * static_cast<size_t>(size_)))
    fail_group(
        fmt::format("NCCL communicator rank {} of {}: all_gather buffers overlap (in place is send == recv + "
                    "rank * count)",
                    rank_, size_));
  check(ncclAllGather(send, recv, count, nccl_type(dtype), as_comm(comm_), stream_), "ncclAllGather");
  leave();
}

void NcclCommunicator::reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) {
  enter("reduce_scatter");
  if (!reducible(dtype))
    fail_group(
        fmt::format("NCCL communicator rank {} of {}: reduce_scatter of {}: no reduction for this dtype",
                    rank_, size_, dtype_name(dtype)));
  if (count > 0 && (!send || !recv))
    fail_group(
        fmt::format("NCCL communicator rank {} of {}: reduce_scatter with a null buffer", rank_, size_));
  const size_t bytes = count * dtype_size(dtype);
  const void* in_place = static_cast<const char*>(send) + static_cast<size_t>(rank_) * bytes;
  if (recv != in_place && overlap(send, bytes * static_cast<size_t>(size_), recv, bytes))
    fail_group(
        fmt::format("NCCL communicator rank {} of {}: reduce_scatter buffers overlap (in place is recv == "
                    "send + rank * count)",
                    rank_, size_));
  check(ncclReduceScatter(send, recv, count, nccl_type(dtype), nccl_op(op), as_comm(comm_), stream_),
        "ncclReduceScatter");
  leave();
}

void NcclCommunicator::broadcast(void* buf, size_t count, DType dtype, int root) {
  enter("broadcast");
  if (root < 0 || root >= size_)
    fail_group(fmt::format("NCCL communicator rank {} of {}: broadcast from root {}, outside the group",
                           rank_, size_, root));
  if (count > 0 && !buf)
    fail_group(fmt::format("NCCL communicator rank {} of {}: broadcast with a null buffer", rank_, size_));
  check(ncclBroadcast(buf, buf, count, nccl_type(dtype), root, as_comm(comm_), stream_), "ncclBroadcast");
  leave();
}

void NcclCommunicator::all_to_all_v(const void* send, std::span<const size_t> send_counts, void* recv,
                                    std::span<const size_t> recv_counts, DType dtype) {
  enter("all_to_all_v");
  const auto n = static_cast<size_t>(size_);
  if (send_counts.size() != n || recv_counts.size() != n)
    fail_group(
        fmt::format("NCCL communicator rank {} of {}: all_to_all_v with {} send and {} receive counts ({} "
                    "needed)",
                    rank_, size_, send_counts.size(), recv_counts.size(), n));
  const size_t es = dtype_size(dtype);
  size_t total_send = 0, total_recv = 0;
  for (size_t j = 0; j < n; ++j) {
    total_send += send_counts[j];
    total_recv += recv_counts[j];
  }
  if ((total_send > 0 && !send) || (total_recv > 0 && !recv))
    fail_group(fmt::format("NCCL communicator rank {} of {}: all_to_all_v with a null buffer", rank_, size_));
  if (overlap(send, total_send * es, recv, total_recv * es))
    fail_group(fmt::format("NCCL communicator rank {} of {}: all_to_all_v send and receive buffers overlap",
                           rank_, size_));
  const ncclDataType_t type = nccl_type(dtype);
  check(ncclGroupStart(), "ncclGroupStart");
  size_t so = 0, ro = 0;
  for (size_t j = 0; j < n; ++j) {
    if (send_counts[j] > 0)
      check(ncclSend(static_cast<const char*>(send) + so * es, send_counts[j], type, static_cast<int>(j),
                     as_comm(comm_), stream_),
            "ncclSend");
    if (recv_counts[j] > 0)
      check(ncclRecv(static_cast<char*>(recv) + ro * es, recv_counts[j], type, static_cast<int>(j),
                     as_comm(comm_), stream_),
            "ncclRecv");
    so += send_counts[j];
    ro += recv_counts[j];
  }
  check(ncclGroupEnd(), "ncclGroupEnd");
  leave();
}

void NcclCommunicator::barrier() {
  enter("barrier");
  check(ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclSum, as_comm(comm_), stream_),
        "ncclAllReduce (barrier)");
  synchronize();
}

void NcclCommunicator::abort(std::string_view reason) {
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    if (!shared_->aborted) {
      shared_->aborted = true;
      shared_->message =
          fmt::format("NCCL communicator group of {} aborted by rank {}: {}", size_, rank_, reason);
    }
  }
  if (comm_ && !comm_aborted_) {
    cudaSetDevice(device_);
    ncclCommAbort(as_comm(comm_));
    comm_aborted_ = true;
  }
}

NcclCommunicatorGroup::NcclCommunicatorGroup(std::span<const int> devices)
    : NcclCommunicatorGroup(devices, {}) {}

NcclCommunicatorGroup::NcclCommunicatorGroup(std::span<const int> devices,
                                             std::span<cudaStream_t const> streams) {
  if (devices.empty()) fail("NCCL communicator group: no devices");
  if (!streams.empty() && streams.size() != devices.size())
    fail("NCCL communicator group: {} streams for {} devices", streams.size(), devices.size());
  int visible = 0;
  check_cuda(cudaGetDeviceCount(&visible), "cudaGetDeviceCount");
  for (int d : devices)
    if (d < 0 || d >= visible)
      fail("NCCL communicator group: device {} does not exist ({} CUDA devices visible)", d, visible);
  disable_nvls();
  const int n = static_cast<int>(devices.size());
  std::vector<ncclComm_t> comms(devices.size());
  const ncclResult_t r = ncclCommInitAll(comms.data(), n, devices.data());
  if (r != ncclSuccess)
    fail("NCCL communicator group: ncclCommInitAll over {} devices failed: {}", n, ncclGetErrorString(r));
  auto shared = std::make_shared<NcclAbortState>();
  for (int i = 0; i < n; ++i) {
    check_cuda(cudaSetDevice(devices[static_cast<size_t>(i)]), "cudaSetDevice");
    cudaStream_t s = nullptr;
    if (streams.empty()) {
      check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
      streams_.push_back(s);
    } else {
      s = streams[static_cast<size_t>(i)];
    }
    ranks_.push_back(std::unique_ptr<NcclCommunicator>(
        new NcclCommunicator(NcclCommunicator::Adopt{}, comms[static_cast<size_t>(i)], i, n,
                             devices[static_cast<size_t>(i)], s, shared)));
  }
}

NcclCommunicatorGroup::~NcclCommunicatorGroup() {
  for (size_t i = 0; i < ranks_.size(); ++i) {
    const int device = ranks_[i]->device();
    ranks_[i].reset();
    cudaSetDevice(device);
    if (i < streams_.size()) cudaStreamDestroy(streams_[i]);
  }
}

void NcclCommunicatorGroup::shutdown(std::string_view reason) {
  for (auto& r : ranks_) r->abort(fmt::format("shut down: {}", reason));
}

}  // namespace polylora
