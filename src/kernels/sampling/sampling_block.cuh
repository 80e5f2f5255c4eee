// kernels/sampling/sampling_block.cuh: the block-wide helpers of the CUDA sampling kernels
// (sampling_cuda.cu): warp and block reductions and scans of 64-bit sums and order keys, the last block of a
// row to finish (a per-row counter), warp-aggregated appends to a gather buffer, a bitonic block sort, the
// first position where a cumulative weight reaches a need, and a histogram's crossing bin. Every thread of
// the block (of kThreads) calls the block_* helpers. Included from sampling_cuda.cu only. Must not: depend
// on anything above common/.
#pragma once

#include <cstdint>

#include "kernels/sampling/sampling.h"
#include "kernels/sampling/sampling_math.h"

namespace polylora::kernels::cuda::sampling_block {

using namespace sampling;
using ull = unsigned long long;

constexpr int kThreads = 256;  // threads of every sampling kernel's block
constexpr int kWarps = kThreads / 32;

__device__ __forceinline__ ull warp_max_u64(ull v) {
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ ull warp_sum_u64(ull v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ inline ull block_max_u64(ull v) {
  __shared__ ull part[kWarps];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_max_u64(v);
  __syncthreads();
  if (lane == 0) part[warp] = v;
  __syncthreads();
  ull r = lane < kWarps ? part[lane] : 0;
  return warp_max_u64(r);
}

__device__ inline ull block_sum_u64(ull v) {
  __shared__ ull part[kWarps];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum_u64(v);
  __syncthreads();
  if (lane == 0) part[warp] = v;
  __syncthreads();
  ull r = lane < kWarps ? part[lane] : 0;
  return warp_sum_u64(r);
}

// Exclusive prefix sum over threadIdx.x; *total gets the block's sum.
__device__ inline ull block_exclusive_scan_u64(ull v, ull* total) {
  __shared__ ull part[kWarps];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  ull x = v;
  for (int o = 1; o < 32; o <<= 1) {
    const ull y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  __syncthreads();
  if (lane == 31) part[warp] = x;
  __syncthreads();
  if (warp == 0) {
    ull w = lane < kWarps ? part[lane] : 0;
    for (int o = 1; o < 32; o <<= 1) {
      const ull y = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += y;
    }
    if (lane < kWarps) part[lane] = w;
  }
  __syncthreads();
  const ull before = warp > 0 ? part[warp - 1] : 0;
  *total = part[kWarps - 1];
  return before + x - v;
}

// True in the last block of its row to get here (nblocks work items per row), which then sees every other
// block's writes. Resets the row's counter for the next kernel.
__device__ inline bool last_block_of_row(uint32_t* counter, int nblocks) {
  __shared__ bool is_last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const uint32_t prev = atomicAdd(counter, 1u);
    is_last = prev == static_cast<uint32_t>(nblocks) - 1;
    if (is_last) atomicExch(counter, 0u);
  }
  __syncthreads();
  const bool last = is_last;
  if (last) __threadfence();
  return last;
}

// Appends `value` to buf[0, kSampleGatherCap) at *counter for the lanes where pred holds (all 32 lanes
// call it).
__device__ __forceinline__ void warp_append(bool pred, ull value, uint32_t* counter, ull* buf) {
  const unsigned mask = __ballot_sync(0xffffffffu, pred);
  if (mask == 0) return;
  const int lane = threadIdx.x & 31;
  const int leader = __ffs(mask) - 1;
  uint32_t base = 0;
  if (lane == leader) base = atomicAdd(counter, static_cast<uint32_t>(__popc(mask)));
  base = __shfl_sync(0xffffffffu, base, leader);
  const uint32_t at = base + static_cast<uint32_t>(__popc(mask & ((1u << lane) - 1u)));
  if (pred && at < kSampleGatherCap) buf[at] = value;
}

// Sorts s[0, n) (n a power of two, <= kSampleGatherCap) descending or ascending, bitonic.
__device__ inline void block_sort(ull* s, int n, bool descending) {
  for (int k = 2; k <= n; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int i = threadIdx.x; i < n; i += kThreads) {
        const int l = i ^ j;
        if (l > i) {
          const ull a = s[i], b = s[l];
          const bool up = ((i & k) == 0) != descending;  // this pair ends ascending
          if ((a > b) == up) {
            s[i] = b;
            s[l] = a;
          }
        }
      }
      __syncthreads();
    }
  }
}

__device__ __forceinline__ int pow2_at_least(int n) {
  int p = 1;
  while (p < n) p <<= 1;
  return p;
}

// The first position j of s[0, n) (weights w(s[j])) whose inclusive cumulative weight is >= need (or,
// with strictly, > need); n - 1 when none. Contiguous segments per thread.
template <typename Weight>
__device__ inline int block_first_cumulative(const ull* s, int n, ull need, bool strictly, Weight w,
                                             ull* total_out) {
  __shared__ int found;
  const int seg = (n + kThreads - 1) / kThreads;
  const int j0 = min(static_cast<int>(threadIdx.x) * seg, n), j1 = min(j0 + seg, n);
  ull sum = 0;
  for (int j = j0; j < j1; ++j) sum += w(s[j]);
  ull total = 0;
  const ull excl = block_exclusive_scan_u64(sum, &total);
  if (threadIdx.x == 0) found = n - 1;
  __syncthreads();
  auto reached = [&](ull cum) { return strictly ? cum > need : cum >= need; };
  if (!reached(excl) && reached(excl + sum)) {
    ull acc = excl;
    for (int j = j0; j < j1; ++j) {
      acc += w(s[j]);
      if (reached(acc)) {
        found = j;
        break;
      }
    }
  }
  __syncthreads();
  const int r = found;
  *total_out = total;
  __syncthreads();
  return r;
}

// The crossing of a global histogram (count, and mass when non-null) for `need`, from the top bin.
// When init_top_p and need == 0, need becomes top_p_need(total mass). *need_used gets the need.
__device__ inline SelectorCrossing block_crossing(const uint32_t* count, const ull* mass, int nbins, ull need,
                                                  bool init_top_p, double top_p, ull* need_used) {
  __shared__ SelectorCrossing result;
  const int per = (nbins + kThreads - 1) / kThreads;
  const int hi = nbins - 1 - static_cast<int>(threadIdx.x) * per;
  const int lo = max(hi - per + 1, 0);
  ull sum = 0, sum_count = 0;
  for (int b = hi; b >= lo; --b) {
    const ull n = __ldcg(count + b);
    sum_count += n;
    sum += mass ? __ldcg(mass + b) : n;
  }
  ull total = 0, total_count = 0;
  const ull excl = block_exclusive_scan_u64(sum, &total);
  const ull excl_count = block_exclusive_scan_u64(sum_count, &total_count);
  if (init_top_p && need == 0) need = top_p_need(total, top_p);
  if (threadIdx.x == 0) result = SelectorCrossing{};
  __syncthreads();
  if (need >= 1 && excl < need && need <= excl + sum) {
    ull acc = excl, acc_count = excl_count;
    for (int b = hi; b >= lo; --b) {
      const ull n = __ldcg(count + b);
      const ull x = mass ? __ldcg(mass + b) : n;
      if (acc + x >= need) {
        SelectorCrossing c{};
        c.found = true;
        c.bin = b;
        c.above = acc;
        c.above_count = static_cast<uint32_t>(acc_count);
        c.bin_count = static_cast<uint32_t>(n);
        c.bin_mass = mass ? x : 0;
        result = c;
        break;
      }
      acc += x;
      acc_count += n;
    }
  }
  __syncthreads();
  const SelectorCrossing r = result;
  *need_used = need;
  __syncthreads();
  return r;
}

}  // namespace polylora::kernels::cuda::sampling_block
