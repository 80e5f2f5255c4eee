// kernels/attention/attention_prefill_cuda.cu: the CUDA-core flash-attention prefill (attention_cuda.cu's
// header says when it runs): a CTA of 4 warps per (block of 64 query rows of one sequence, head); K/V tiles
// of 32 keys gathered through the block table into shared memory; each warp owns 16 query rows, each lane a
// 4×4 block of the score tile and a 4-row × head_dim/8 slice of the output; online softmax; causal + sliding
// window masks; the sink logit joins the denominator. Must not: depend on anything above common/.
#include "kernels/attention/attention.h"
#include "kernels/attention/attention_cuda_common.cuh"
#include "kernels/cuda_util.cuh"

namespace polylora::kernels::cuda::attention_detail {
namespace {

constexpr int kFaBKV = 32;  // keys per tile
constexpr int kFaThreads = kWarps * 32;

template <int D>
struct FaCfg {
  static constexpr int kQS = D + 4;  // Q and K row stride in floats (bank-conflict-free float4 reads)
  static constexpr int kQFloats = kFaBQ * kQS;
  static constexpr int kKFloats = kFaBKV * kQS;
  static constexpr int kVFloats = kFaBKV * D;
  static constexpr int kPFloats = kWarps * kFaBKV * 16;  // per warp [key][16 row slots]
  static constexpr int kSmemBytes = 4 * (kQFloats + kKFloats + kVFloats + kPFloats);
  static constexpr int kNV = D / 32;  // float4 output columns per lane
};

template <int D, bool B16>
__global__ void __launch_bounds__(kFaThreads) attention_prefill_kernel(AttentionArgs a, bool vec4) {
  using C = FaCfg<D>;
  extern __shared__ __align__(16) float fa_smem[];
  float* Qs = fa_smem;
  float* Ks = Qs + C::kQFloats;
  float* Vs = Ks + C::kKFloats;
  float* Ps = Vs + C::kVFloats;
  __shared__ int s_seq, s_blk;
  fa_find_block(a, blockIdx.x, &s_seq, &s_blk);
  __syncthreads();
  if (s_seq < 0) return;
  const KvCacheView& c = a.cache;
  // The block's set-up as fa_block's, written out: through FaBlock this kernel took 196 registers at
  // head_dim 128 instead of 168 (ptxas, sm_90a), two CTAs per SM instead of three.
  const int s = s_seq, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t h = blockIdx.y, kvh = h / (a.num_heads / c.num_kv_heads);
  const int64_t q_begin = a.query_start[s], q_len = a.query_start[s + 1] - q_begin, ctx = a.context_lens[s];
  const int row0 = s_blk * kFaBQ;
  const int nrows = static_cast<int>(q_len - row0 < kFaBQ ? q_len - row0 : kFaBQ);
  const int64_t pos0 = ctx - q_len + row0;  // position of the block's first row
  const int64_t klast = pos0 + nrows - 1;
  const int64_t kfirst = a.window > 0 ? max(static_cast<int64_t>(0), pos0 - a.window + 1) : 0;
  const int32_t* table = a.block_tables + s * a.max_blocks_per_seq;

  for (int idx = tid; idx < kFaBQ * D; idx += kFaThreads) {
    const int r = idx / D, d = idx % D;
    Qs[r * C::kQS + d] = r < nrows ? a.q[(q_begin + row0 + r) * a.ldq + h * D + d] : 0.0f;
  }
  // Lane (rg, kg): rows warp·16 + rg + 4i (i < 4), keys kg + 8cc (cc < 4) of a tile, output columns
  // kg·4 + 32jj + (0..3) (jj < kNV).
  const int rg = lane >> 3, kg = lane & 7;
  int64_t pos[4];
  bool valid[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = warp * 16 + rg + 4 * i;
    valid[i] = r < nrows;
    pos[i] = pos0 + r;
  }
  const int64_t warp_pos_last = pos0 + min(warp * 16 + 15, nrows - 1);
  const int64_t warp_first = a.window > 0 ? max(static_cast<int64_t>(0), pos0 + warp * 16 - a.window + 1) : 0;
  const bool warp_active = warp * 16 < nrows;
  const float sink = a.sinks != nullptr ? a.sinks[h] : -INFINITY;
  float m[4], l[4], o[4][C::kNV][4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    m[i] = sink;
    l[i] = a.sinks != nullptr ? 1.0f : 0.0f;
#pragma unroll
    for (int jj = 0; jj < C::kNV; ++jj)
#pragma unroll
      for (int q = 0; q < 4; ++q) o[i][jj][q] = 0.0f;
  }
  float* Pw = Ps + warp * kFaBKV * 16;

  for (int64_t kt0 = kfirst; kt0 <= klast; kt0 += kFaBKV) {
    __syncthreads();  // the previous tile is no longer read
    if (vec4) {
      constexpr int kRowV = D / 4;
      for (int idx = tid; idx < kFaBKV * kRowV; idx += kFaThreads) {
        const int kk = idx / kRowV, d4 = idx % kRowV;
        const int64_t j = kt0 + kk;
        float4 kv4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f), vv4 = kv4;
        if (j <= klast) {
          const int64_t off = kv_offset(c, table, j, kvh) + d4 * 4;
          kv4 = kv_load4<B16>(c.k, off);
          vv4 = kv_load4<B16>(c.v, off);
        }
        *reinterpret_cast<float4*>(Ks + kk * C::kQS + d4 * 4) = kv4;
        *reinterpret_cast<float4*>(Vs + kk * D + d4 * 4) = vv4;
      }
    } else {
      for (int idx = tid; idx < kFaBKV * D; idx += kFaThreads) {
        const int kk = idx / D, d = idx % D;
        const int64_t j = kt0 + kk;
        float kv = 0.0f, vv = 0.0f;
        if (j <= klast) {
          const int64_t off = kv_offset(c, table, j, kvh) + d;
          kv = kv_load<B16>(c.k, off);
          vv = kv_load<B16>(c.v, off);
        }
        Ks[kk * C::kQS + d] = kv;
        Vs[kk * D + d] = vv;
      }
    }
    __syncthreads();
    if (!warp_active || kt0 > warp_pos_last || kt0 + kFaBKV - 1 < warp_first) continue;
    float sc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int cc = 0; cc < 4; ++cc) sc[i][cc] = 0.0f;
#pragma unroll 4
    for (int d = 0; d < D; d += 4) {
      float4 qv[4], kv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i)
        qv[i] = *reinterpret_cast<const float4*>(Qs + (warp * 16 + rg + 4 * i) * C::kQS + d);
#pragma unroll
      for (int cc = 0; cc < 4; ++cc)
        kv[cc] = *reinterpret_cast<const float4*>(Ks + (kg + 8 * cc) * C::kQS + d);
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int cc = 0; cc < 4; ++cc) {
          sc[i][cc] = fmaf(qv[i].x, kv[cc].x, sc[i][cc]);
          sc[i][cc] = fmaf(qv[i].y, kv[cc].y, sc[i][cc]);
          sc[i][cc] = fmaf(qv[i].z, kv[cc].z, sc[i][cc]);
          sc[i][cc] = fmaf(qv[i].w, kv[cc].w, sc[i][cc]);
        }
    }
    float corr[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float mx = -INFINITY;
#pragma unroll
      for (int cc = 0; cc < 4; ++cc) {
        const int64_t j = kt0 + kg + 8 * cc;
        const bool ok = valid[i] && j <= pos[i] && (a.window <= 0 || pos[i] - j < a.window);
        sc[i][cc] = ok ? sc[i][cc] * a.scale : -INFINITY;
        mx = fmaxf(mx, sc[i][cc]);
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
      const float m_new = fmaxf(m[i], mx);
      corr[i] = m_new == -INFINITY ? 1.0f : expf(m[i] - m_new);
      float sum = 0.0f;
#pragma unroll
      for (int cc = 0; cc < 4; ++cc) {
        sc[i][cc] = sc[i][cc] == -INFINITY ? 0.0f : expf(sc[i][cc] - m_new);
        sum += sc[i][cc];
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      sum += __shfl_xor_sync(0xffffffffu, sum, 4);
      l[i] = l[i] * corr[i] + sum;
      m[i] = m_new;
    }
#pragma unroll
    for (int cc = 0; cc < 4; ++cc)
      *reinterpret_cast<float4*>(Pw + (kg + 8 * cc) * 16 + rg * 4) =
          make_float4(sc[0][cc], sc[1][cc], sc[2][cc], sc[3][cc]);
    __syncwarp();
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int jj = 0; jj < C::kNV; ++jj)
#pragma unroll
        for (int q = 0; q < 4; ++q) o[i][jj][q] *= corr[i];
#pragma unroll 4
    for (int kk = 0; kk < kFaBKV; ++kk) {
      const float4 pv = *reinterpret_cast<const float4*>(Pw + kk * 16 + rg * 4);
      const float p4[4] = {pv.x, pv.y, pv.z, pv.w};
#pragma unroll
      for (int jj = 0; jj < C::kNV; ++jj) {
        const float4 vv = *reinterpret_cast<const float4*>(Vs + kk * D + kg * 4 + 32 * jj);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          o[i][jj][0] = fmaf(p4[i], vv.x, o[i][jj][0]);
          o[i][jj][1] = fmaf(p4[i], vv.y, o[i][jj][1]);
          o[i][jj][2] = fmaf(p4[i], vv.z, o[i][jj][2]);
          o[i][jj][3] = fmaf(p4[i], vv.w, o[i][jj][3]);
        }
      }
    }
    __syncwarp();  // Pw is rewritten by the next tile
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if (!valid[i]) continue;
    const float inv = 1.0f / l[i];
    float* out = a.out + (q_begin + row0 + warp * 16 + rg + 4 * i) * a.ldo + h * D;
#pragma unroll
    for (int jj = 0; jj < C::kNV; ++jj)
#pragma unroll
      for (int q = 0; q < 4; ++q) out[kg * 4 + 32 * jj + q] = o[i][jj][q] * inv;
  }
}

}  // namespace

template <int D, bool B16>
void launch_prefill(const AttentionArgs& a, cudaStream_t st) {
  static const bool configured = [] {
    CUDA_CHECK(cudaFuncSetAttribute(attention_prefill_kernel<D, B16>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, FaCfg<D>::kSmemBytes));
    return true;
  }();
  (void)configured;
  attention_prefill_kernel<D, B16>
      <<<prefill_grid(a), kFaThreads, FaCfg<D>::kSmemBytes, st>>>(a, cache_vec4(a.cache));
  CUDA_CHECK_LAUNCH();
}
template void launch_prefill<64, false>(const AttentionArgs&, cudaStream_t);
template void launch_prefill<64, true>(const AttentionArgs&, cudaStream_t);
template void launch_prefill<128, false>(const AttentionArgs&, cudaStream_t);
template void launch_prefill<128, true>(const AttentionArgs&, cudaStream_t);

}  // namespace polylora::kernels::cuda::attention_detail
