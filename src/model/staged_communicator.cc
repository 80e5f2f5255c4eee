// model/staged_communicator.cc: see staged_communicator.h.
#include "model/staged_communicator.h"

#include <algorithm>
#include <numeric>

#include "common/error.h"

namespace polylora {

void StagedCommunicator::down(const void* src, size_t bytes) {
  send_.resize(std::max<size_t>(bytes, 1));                   // never a null buffer for the host group
  if (bytes > 0) be_.copy_to_host(send_.data(), src, bytes);  // waits for the backend's queue
}

void StagedCommunicator::up(void* dst, size_t bytes) {
  if (bytes > 0) be_.copy_to_device(dst, recv_.data(), bytes);
}

void StagedCommunicator::all_reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) {
  const size_t bytes = count * dtype_size(dtype);
  down(send, bytes);
  recv_.resize(std::max<size_t>(bytes, 1));
  host_.all_reduce(send_.data(), recv_.data(), count, dtype, op);
  up(recv, bytes);
}

void StagedCommunicator::all_gather(const void* send, void* recv, size_t count, DType dtype) {
  const size_t bytes = count * dtype_size(dtype);
  down(send, bytes);
  recv_.resize(std::max<size_t>(bytes * static_cast<size_t>(size()), 1));
  host_.all_gather(send_.data(), recv_.data(), count, dtype);
  up(recv, bytes * static_cast<size_t>(size()));
}

void StagedCommunicator::reduce_scatter(const void* send, void* recv, size_t count, DType dtype,
                                        ReduceOp op) {
  const size_t bytes = count * dtype_size(dtype);
  down(send, bytes * static_cast<size_t>(size()));
  recv_.resize(std::max<size_t>(bytes, 1));
  host_.reduce_scatter(send_.data(), recv_.data(), count, dtype, op);
  up(recv, bytes);
}

void StagedCommunicator::broadcast(void* buf, size_t count, DType dtype, int root) {
  const size_t bytes = count * dtype_size(dtype);
  down(buf, bytes);
  host_.broadcast(send_.data(), count, dtype, root);
  if (bytes > 0) be_.copy_to_device(buf, send_.data(), bytes);
}

void StagedCommunicator::all_to_all_v(const void* send, std::span<const size_t> send_counts, void* recv,
                                      std::span<const size_t> recv_counts, DType dtype) {
  const size_t es = dtype_size(dtype);
  const size_t out = std::accumulate(send_counts.begin(), send_counts.end(), size_t{0}) * es;
  const size_t in = std::accumulate(recv_counts.begin(), recv_counts.end(), size_t{0}) * es;
  down(send, out);
  recv_.resize(std::max<size_t>(in, 1));
  host_.all_to_all_v(send_.data(), send_counts, recv_.data(), recv_counts, dtype);
  up(recv, in);
}

}  // namespace polylora
