// runtime/communicator.cc: CpuCommunicatorGroup, collectives between threads of one process.
//
// A collective has phases separated by rendezvous under the group's mutex (each completed rendezvous
// bumps `generation`, which the waiting ranks watch on the condition variable):
//   start:  every rank posts its Call; the last to arrive validates them all (same collective, dtype,
//           counts, op, root; all_to_all_v counts consistent pairwise) and sizes the scratch.
//   data:   every rank reads the others' posted buffers and writes its own output (all_reduce: its
//           1/N of the elements into the shared scratch, in rank order).
//   finish: every rank waits until all have finished reading, so inputs may be reused on return
//           (all_reduce then copies the scratch to its recv; the next start cannot touch the scratch
//           before every rank has arrived there).
// Aborting sets a flag and wakes everyone. A rank released by an abort waits until no rank is still in
// a data phase (`busy`; a data phase is a bounded copy, never a wait) before throwing, so no rank can
// read a buffer whose owner has already unwound.
#include "runtime/communicator.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <mutex>

#include "common/error.h"

namespace polylora {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kMax:
      return "max";
  }
  return "?";
}

namespace {

enum class Kind : uint8_t { kAllReduce, kAllGather, kReduceScatter, kBroadcast, kAllToAllV, kBarrier };

std::string_view kind_name(Kind kind) {
  switch (kind) {
    case Kind::kAllReduce:
      return "all_reduce";
    case Kind::kAllGather:
      return "all_gather";
    case Kind::kReduceScatter:
      return "reduce_scatter";
    case Kind::kBroadcast:
      return "broadcast";
    case Kind::kAllToAllV:
      return "all_to_all_v";
    case Kind::kBarrier:
      return "barrier";
  }
  return "?";
}

// One rank's arguments to the collective it is in.
struct Call {
  Kind kind = Kind::kBarrier;
  size_t count = 0;
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  const std::byte* send = nullptr;
  std::byte* recv = nullptr;
  std::span<const size_t> send_counts;
  std::span<const size_t> recv_counts;
};

std::string describe(const Call& call) {
  switch (call.kind) {
    case Kind::kAllReduce:
    case Kind::kReduceScatter:
      return fmt::format("{}(count={}, {}, {})", kind_name(call.kind), call.count, dtype_name(call.dtype),
                         reduce_op_name(call.op));
    case Kind::kAllGather:
      return fmt::format("all_gather(count={}, {})", call.count, dtype_name(call.dtype));
    case Kind::kBroadcast:
      return fmt::format("broadcast(count={}, {}, root={})", call.count, dtype_name(call.dtype), call.root);
    case Kind::kAllToAllV:
      return fmt::format("all_to_all_v({}, send_counts=[{}], recv_counts=[{}])", dtype_name(call.dtype),
                         fmt::join(call.send_counts, ", "), fmt::join(call.recv_counts, ", "));
    case Kind::kBarrier:
      return "barrier()";
  }
  return "?";
}

bool has_data_phase(Kind kind) {
  return kind != Kind::kBarrier;
}

bool reducible(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16 || dtype == DType::kI32 ||
         dtype == DType::kI64;
}

// Whether byte ranges [a, a + a_bytes) and [b, b + b_bytes) share a byte.
bool overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return a_bytes != 0 && b_bytes != 0 && pa < pb + b_bytes && pb < pa + a_bytes;
}

// dst[i] = combine(...combine(load(srcs[0][i]), load(srcs[1][i]))..., load(srcs[n-1][i])), stored once.
// A block of every source is read before the block of dst is written, so dst may be one of the sources.
template <typename T, typename Acc, typename Load, typename Store, typename Combine>
void reduce_typed(const std::byte* const* srcs, int n, size_t count, std::byte* dst, Load load, Store store,
                  Combine combine) {
  constexpr size_t kBlock = 512;
  Acc acc[kBlock];
  auto element = [](const std::byte* p, size_t i) {
    T v;
    std::memcpy(&v, p + i * sizeof(T), sizeof(T));
    return v;
  };
  for (size_t base = 0; base < count; base += kBlock) {
    const size_t m = std::min(kBlock, count - base);
    const std::byte* s0 = srcs[0] + base * sizeof(T);
    for (size_t k = 0; k < m; ++k) acc[k] = load(element(s0, k));
    for (int j = 1; j < n; ++j) {
      const std::byte* sj = srcs[j] + base * sizeof(T);
      for (size_t k = 0; k < m; ++k) acc[k] = combine(acc[k], load(element(sj, k)));
    }
    std::byte* d = dst + base * sizeof(T);
    for (size_t k = 0; k < m; ++k) {
      const T v = store(acc[k]);
      std::memcpy(d + k * sizeof(T), &v, sizeof(T));
    }
  }
}

float max_f32(float a, float b) {
  if (std::isnan(a)) return a;
  return std::isnan(b) || b > a ? b : a;
}

template <typename T, typename Load, typename Store>
void reduce_float(const std::byte* const* srcs, int n, size_t count, std::byte* dst, ReduceOp op, Load load,
                  Store store) {
  if (op == ReduceOp::kSum) {
    reduce_typed<T, float>(srcs, n, count, dst, load, store, [](float a, float b) { return a + b; });
  } else {
    reduce_typed<T, float>(srcs, n, count, dst, load, store, max_f32);
  }
}

template <typename T>
void reduce_int(const std::byte* const* srcs, int n, size_t count, std::byte* dst, ReduceOp op) {
  using U = std::make_unsigned_t<T>;
  auto id = [](T v) { return v; };
  if (op == ReduceOp::kSum) {  // wraps, as NCCL's integer sums do
    reduce_typed<T, T>(srcs, n, count, dst, id, id,
                       [](T a, T b) { return static_cast<T>(static_cast<U>(a) + static_cast<U>(b)); });
  } else {
    reduce_typed<T, T>(srcs, n, count, dst, id, id, [](T a, T b) { return b > a ? b : a; });
  }
}

void reduce(const std::byte* const* srcs, int n, size_t count, std::byte* dst, DType dtype, ReduceOp op) {
  if (count == 0) return;
  if (n == 1) {
    if (srcs[0] != dst) std::memmove(dst, srcs[0], count * dtype_size(dtype));
    return;
  }
  switch (dtype) {
    case DType::kF32:
      return reduce_float<float>(
          srcs, n, count, dst, op, [](float v) { return v; }, [](float v) { return v; });
    case DType::kF16:
      return reduce_float<uint16_t>(srcs, n, count, dst, op, f16_to_f32, f32_to_f16);
    case DType::kBF16:
      return reduce_float<uint16_t>(
          srcs, n, count, dst, op, [](uint16_t v) { return bf16_to_f32(v); },
          [](float v) { return f32_to_bf16(v); });
    case DType::kI32:
      return reduce_int<int32_t>(srcs, n, count, dst, op);
    case DType::kI64:
      return reduce_int<int64_t>(srcs, n, count, dst, op);
    default:
      CHECK_MSG(false, "reduction of {} passed argument checks", dtype_name(dtype));
  }
}

}  // namespace

struct CpuCommunicatorGroup::State {
  explicit State(int n) : size(n), calls(n) {}

  const int size;
  mutable std::mutex mutex;
  std::condition_variable cv;
  uint64_t generation = 0;   // completed rendezvous
  uint64_t collectives = 0;  // collectives every rank has started (the index in mismatch messages)
  int arrived = 0;           // ranks waiting at the current rendezvous
  int busy = 0;              // ranks in a data phase, reading the others' buffers
  bool aborted = false;
  std::string message;  // why the group aborted; every rank's Error says this
  std::vector<Call> calls;
  std::vector<std::byte> scratch;  // all_reduce results, reduced 1/N by each rank

  void abort_locked(std::string why) {
    if (!aborted) {
      aborted = true;
      message = std::move(why);
    }
    cv.notify_all();
  }

  [[noreturn]] void throw_aborted(std::unique_lock<std::mutex>& lock) {
    cv.wait(lock, [&] { return busy == 0; });
    fail("{}", message);
  }

  // Waits for the rendezvous that began at `gen` to complete; throws if the group aborts first.
  void wait(std::unique_lock<std::mutex>& lock, uint64_t gen) {
    cv.wait(lock, [&] { return generation != gen || aborted; });
    if (generation == gen) throw_aborted(lock);
  }

  // The first mismatch between the posted calls, or "" when they agree.
  std::string mismatch() const {
    const Call& c0 = calls[0];
    for (int r = 1; r < size; ++r) {
      const Call& c = calls[r];
      bool same = c.kind == c0.kind && c.dtype == c0.dtype;
      if (same && c.kind != Kind::kAllToAllV) same = c.count == c0.count;
      if (same && (c.kind == Kind::kAllReduce || c.kind == Kind::kReduceScatter)) same = c.op == c0.op;
      if (same && c.kind == Kind::kBroadcast) same = c.root == c0.root;
      if (!same) {
        return fmt::format(
            "collective mismatch at collective {} of a {}-rank CPU communicator group: rank 0 called {} but "
            "rank {} called {} (every rank must call the same collectives with the same arguments, in the "
            "same order)",
            collectives, size, describe(c0), r, describe(c));
      }
    }
    if (c0.kind == Kind::kAllToAllV) {
      for (int i = 0; i < size; ++i) {
        for (int j = 0; j < size; ++j) {
          if (calls[i].send_counts[j] != calls[j].recv_counts[i]) {
            return fmt::format(
                "all_to_all_v count mismatch at collective {} of a {}-rank CPU communicator group: rank {} "
                "sends {} elements to rank {}, but rank {} expects {} from rank {}",
                collectives, size, i, calls[i].send_counts[j], j, j, calls[j].recv_counts[i], i);
          }
        }
      }
    }
    return "";
  }

  // Posts `call` for `rank` and returns once every rank has posted a matching one.
  void start(int rank, const Call& call) {
    std::unique_lock<std::mutex> lock(mutex);
    if (aborted) throw_aborted(lock);
    calls[rank] = call;
    const uint64_t gen = generation;
    if (++arrived < size) return wait(lock, gen);
    arrived = 0;
    std::string why = mismatch();
    if (why.empty() && call.kind == Kind::kAllReduce) {
      try {
        scratch.resize(std::max(scratch.size(), call.count * dtype_size(call.dtype)));
      } catch (const std::exception& e) {
        why = fmt::format("all_reduce of {} elements: cannot allocate the scratch buffer: {}", call.count,
                          e.what());
      }
    }
    if (!why.empty()) {
      abort_locked(std::move(why));
      throw_aborted(lock);
    }
    ++collectives;
    ++generation;
    busy = has_data_phase(call.kind) ? size : 0;
    cv.notify_all();
  }

  // Ends the calling rank's data phase; returns once every rank has ended its own.
  void finish() {
    std::unique_lock<std::mutex> lock(mutex);
    if (--busy == 0 && aborted) cv.notify_all();
    if (aborted) throw_aborted(lock);
    const uint64_t gen = generation;
    if (++arrived < size) return wait(lock, gen);
    arrived = 0;
    ++generation;
    cv.notify_all();
  }
};

namespace {

class CpuCommunicator final : public Communicator {
 public:
  CpuCommunicator(CpuCommunicatorGroup::State& state, int rank) : s_(state), rank_(rank), srcs_(state.size) {}

  int rank() const override { return rank_; }
  int size() const override { return s_.size; }

  void all_reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override {
    Call call = make(Kind::kAllReduce, send, recv, count, dtype);
    call.op = op;
    check_reducible(call);
    const size_t bytes = count * dtype_size(dtype);
    check_pointers(call, send, bytes, recv, bytes);
    if (send != recv && overlap(send, bytes, recv, bytes))
      invalid(call, "send and recv overlap without being the same buffer");
    s_.start(rank_, call);
    const size_t lo = count * rank_ / s_.size, hi = count * (rank_ + 1) / s_.size;
    const size_t elem = dtype_size(dtype);
    reduce(sources(lo * elem), s_.size, hi - lo, s_.scratch.data() + lo * elem, dtype, op);
    s_.finish();
    if (bytes != 0) std::memcpy(recv, s_.scratch.data(), bytes);
  }

  void all_gather(const void* send, void* recv, size_t count, DType dtype) override {
    Call call = make(Kind::kAllGather, send, recv, count, dtype);
    const size_t bytes = count * dtype_size(dtype);
    check_pointers(call, send, bytes, recv, bytes * s_.size);
    const auto* in_place = static_cast<const std::byte*>(recv) + rank_ * bytes;
    if (send != in_place && overlap(send, bytes, recv, bytes * s_.size))
      invalid(call, "send overlaps recv without being recv + rank * count");
    s_.start(rank_, call);
    for (int j = 0; j < s_.size; ++j) {
      std::byte* dst = call.recv + j * bytes;
      if (s_.calls[j].send != dst && bytes != 0) std::memcpy(dst, s_.calls[j].send, bytes);
    }
    s_.finish();
  }

  void reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override {
    Call call = make(Kind::kReduceScatter, send, recv, count, dtype);
    call.op = op;
    check_reducible(call);
    const size_t bytes = count * dtype_size(dtype);
    check_pointers(call, send, bytes * s_.size, recv, bytes);
    const auto* in_place = static_cast<const std::byte*>(send) + rank_ * bytes;
    if (recv != in_place && overlap(send, bytes * s_.size, recv, bytes))
      invalid(call, "recv overlaps send without being send + rank * count");
    s_.start(rank_, call);
    reduce(sources(rank_ * bytes), s_.size, count, call.recv, dtype, op);
    s_.finish();
  }

  void broadcast(void* buf, size_t count, DType dtype, int root) override {
    Call call = make(Kind::kBroadcast, buf, buf, count, dtype);
    call.root = root;
    if (root < 0 || root >= s_.size) invalid(call, fmt::format("root {} is not a rank of the group", root));
    const size_t bytes = count * dtype_size(dtype);
    check_pointers(call, buf, bytes, buf, bytes);
    s_.start(rank_, call);
    if (rank_ != root && bytes != 0) std::memcpy(call.recv, s_.calls[root].send, bytes);
    s_.finish();
  }

  void all_to_all_v(const void* send, std::span<const size_t> send_counts, void* recv,
                    std::span<const size_t> recv_counts, DType dtype) override {
    Call call = make(Kind::kAllToAllV, send, recv, 0, dtype);
    call.send_counts = send_counts;
    call.recv_counts = recv_counts;
    if (send_counts.size() != static_cast<size_t>(s_.size) ||
        recv_counts.size() != static_cast<size_t>(s_.size))
      invalid(call, fmt::format("send_counts and recv_counts need {} entries (one per rank), not {} and {}",
                                s_.size, send_counts.size(), recv_counts.size()));
    const size_t elem = dtype_size(dtype);
    size_t send_total = 0, recv_total = 0;
    for (size_t c : send_counts) send_total += c;
    for (size_t c : recv_counts) recv_total += c;
    check_pointers(call, send, send_total * elem, recv, recv_total * elem);
    if (overlap(send, send_total * elem, recv, recv_total * elem)) invalid(call, "send and recv overlap");
    s_.start(rank_, call);
    size_t recv_offset = 0;
    for (int i = 0; i < s_.size; ++i) {
      const Call& from = s_.calls[i];
      size_t send_offset = 0;
      for (int k = 0; k < rank_; ++k) send_offset += from.send_counts[k];
      const size_t n = recv_counts[i];
      if (n != 0) std::memcpy(call.recv + recv_offset * elem, from.send + send_offset * elem, n * elem);
      recv_offset += n;
    }
    s_.finish();
  }

  void barrier() override { s_.start(rank_, Call{}); }

  void abort(std::string_view reason) override {
    std::lock_guard<std::mutex> lock(s_.mutex);
    s_.abort_locked(fmt::format("CPU communicator group aborted by rank {}: {}", rank_, reason));
  }

 private:
  static Call make(Kind kind, const void* send, void* recv, size_t count, DType dtype) {
    Call call;
    call.kind = kind;
    call.count = count;
    call.dtype = dtype;
    call.send = static_cast<const std::byte*>(send);
    call.recv = static_cast<std::byte*>(recv);
    return call;
  }

  // Aborts the group (the other ranks would otherwise wait for this one) and throws.
  [[noreturn]] void invalid(const Call& call, std::string_view why) {
    std::unique_lock<std::mutex> lock(s_.mutex);
    s_.abort_locked(fmt::format("rank {} of a {}-rank CPU communicator group called {}: {}", rank_, s_.size,
                                describe(call), why));
    s_.throw_aborted(lock);
  }

  void check_reducible(const Call& call) {
    if (!reducible(call.dtype))
      invalid(call,
              fmt::format("{} has no reduction (F32, F16, BF16, I32 and I64 do)", dtype_name(call.dtype)));
  }

  void check_pointers(const Call& call, const void* send, size_t send_bytes, const void* recv,
                      size_t recv_bytes) {
    if ((send == nullptr && send_bytes != 0) || (recv == nullptr && recv_bytes != 0))
      invalid(call, "a null buffer for a non-empty transfer");
  }

  // Every rank's send buffer, advanced by `offset` bytes, in rank order.
  const std::byte* const* sources(size_t offset) {
    for (int j = 0; j < s_.size; ++j) srcs_[j] = s_.calls[j].send + offset;
    return srcs_.data();
  }

  CpuCommunicatorGroup::State& s_;
  const int rank_;
  std::vector<const std::byte*> srcs_;  // sources() of the current reduction
};

}  // namespace

CpuCommunicatorGroup::CpuCommunicatorGroup(int size) {
  if (size < 1) fail("a CPU communicator group needs at least one rank, not {}", size);
  state_ = std::make_unique<State>(size);
  for (int r = 0; r < size; ++r) communicators_.push_back(std::make_unique<CpuCommunicator>(*state_, r));
}

CpuCommunicatorGroup::~CpuCommunicatorGroup() = default;

int CpuCommunicatorGroup::size() const {
  return state_->size;
}

Communicator& CpuCommunicatorGroup::communicator(int rank) {
  if (rank < 0 || rank >= state_->size)
    fail("rank {} is not in a CPU communicator group of {} ranks", rank, state_->size);
  return *communicators_[rank];
}

void CpuCommunicatorGroup::shutdown(std::string_view reason) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->abort_locked(fmt::format("CPU communicator group shut down: {}", reason));
}

bool CpuCommunicatorGroup::aborted() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->aborted;
}

}  // namespace polylora
