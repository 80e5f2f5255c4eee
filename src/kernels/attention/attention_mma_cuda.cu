// kernels/attention/attention_mma_cuda.cu: paged prefill attention on bf16 tensor cores (flash attention 2
// with mma.sync m16n8k16, f32 accumulation), for head_dim 64 and 128, on a BF16 backend when the tuning
// field attention_prefill_mma is set (attention_cuda.cu chooses; the CUDA-core f32 kernel stays the
// reference path and the fp32 mode's). Same grid and arguments as the CUDA-core prefill: a CTA of 4 warps
// per (block of 64 query rows of one sequence, head), each warp 16 query rows. The block's queries are
// rounded to bf16 once and kept as mma A fragments in registers; per tile of 64 keys (gathered through the
// block table, rounded to bf16 into shared memory rows padded to an odd number of 16-byte chunks so
// ldmatrix reads them without bank conflicts), S = Q·Kᵀ on the tensor cores (K rows as the B operand),
// scale, causal / sliding-window masks and the online softmax on the accumulators (a row's 64 scores are
// held by the 4 threads of a quad), P rounded to bf16 straight from the accumulator fragments into A
// fragments, O += P·V (V rows through ldmatrix.trans). The sink logit starts each row's max and denominator
// as in the f32 kernel. Numerics: queries, keys, values and probabilities in bf16 (as Hugging Face's bf16
// forward), sums in f32. Compiled, not yet run on a GPU (session 38): off by default. Must not: depend on
// anything above common/.
#include "kernels/attention/attention_cuda_common.cuh"
#include "kernels/mma_util.cuh"

namespace polylora::kernels::cuda::attention_detail {
namespace {

constexpr int kFmThreads = kWarps * 32;
constexpr int kFmBKV = 64;  // keys per tile

static_assert(kFmBKV == kFaBQ, "the Q, K and V tiles share one shape");

template <int D>
struct FmCfg {
  static constexpr int kStride = D + 8;  // bf16 per shared-memory row: an odd number of 16-byte chunks
  static constexpr int kTileElems = kFaBQ * kStride;
  static constexpr int kSmemBytes = 3 * kTileElems * 2;  // Q, K and V tiles
  static constexpr int kDK = D / 16;                     // k16 steps over the head dimension
  static constexpr int kNS = kFmBKV / 8;                 // n8 score fragments per row tile
  static constexpr int kNO = D / 8;                      // n8 output fragments
};

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  return static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(lo))) |
         (static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(hi))) << 16);
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

template <int D, bool B16>
__global__ void __launch_bounds__(kFmThreads) attention_prefill_mma_kernel(AttentionArgs a, bool vec4) {
  using C = FmCfg<D>;
  extern __shared__ __align__(16) unsigned char fm_smem[];
  auto* Qs = reinterpret_cast<__nv_bfloat16*>(fm_smem);
  __nv_bfloat16* Ks = Qs + C::kTileElems;
  __nv_bfloat16* Vs = Ks + C::kTileElems;
  __shared__ int s_seq, s_blk;
  fa_find_block(a, blockIdx.x, &s_seq, &s_blk);
  __syncthreads();
  if (s_seq < 0) return;
  const KvCacheView& c = a.cache;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const FaBlock fb = fa_block(a, s_seq, s_blk, blockIdx.y);
  const int64_t h = fb.h, kvh = fb.kvh, q_begin = fb.q_begin, pos0 = fb.pos0, klast = fb.klast,
                kfirst = fb.kfirst;
  const int row0 = fb.row0, nrows = fb.nrows;
  const int32_t* table = fb.table;

  // The block's queries as bf16 (rows past nrows zero; q rows may be unaligned: element loads, once).
  for (int idx = tid; idx < kFaBQ * (D / 2); idx += kFmThreads) {
    const int r = idx / (D / 2), d = (idx % (D / 2)) * 2;
    float x0 = 0.0f, x1 = 0.0f;
    if (r < nrows) {
      const float* qrow = a.q + (q_begin + row0 + r) * a.ldq + h * D;
      x0 = qrow[d];
      x1 = qrow[d + 1];
    }
    *reinterpret_cast<uint32_t*>(Qs + r * C::kStride + d) = pack_bf16(x0, x1);
  }
  __syncthreads();
  const uint32_t q_base = static_cast<uint32_t>(__cvta_generic_to_shared(Qs));
  const uint32_t k_base = static_cast<uint32_t>(__cvta_generic_to_shared(Ks));
  const uint32_t v_base = static_cast<uint32_t>(__cvta_generic_to_shared(Vs));
  uint32_t qf[C::kDK][4];  // the warp's 16 rows as A fragments, one per k16 step
#pragma unroll
  for (int kk = 0; kk < C::kDK; ++kk)
    mma::ldmatrix_x4(qf[kk],
                     q_base + 2 * ((warp * 16 + (lane & 15)) * C::kStride + kk * 16 + (lane >> 4) * 8));

  // This thread's rows: warp·16 + g (hh 0) and + 8 (hh 1); accumulator pairs [2hh], [2hh + 1].
  int64_t pos[2];
  bool valid[2];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int r = warp * 16 + g + 8 * hh;
    valid[hh] = r < nrows;
    pos[hh] = pos0 + r;
  }
  const int64_t warp_pos_last = fb.warp_last(warp), warp_first = fb.warp_first(a, warp);
  const bool warp_active = fb.warp_active(warp);
  const float sink = a.sinks != nullptr ? a.sinks[h] : -INFINITY;
  float m[2], l[2], o[C::kNO][4];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    m[hh] = sink;
    l[hh] = a.sinks != nullptr ? 1.0f : 0.0f;
  }
#pragma unroll
  for (int nb = 0; nb < C::kNO; ++nb)
#pragma unroll
    for (int q = 0; q < 4; ++q) o[nb][q] = 0.0f;

  for (int64_t kt0 = kfirst; kt0 <= klast; kt0 += kFmBKV) {
    __syncthreads();  // the previous tile is no longer read
    // K and V rows of the tile as bf16 (keys past klast zero).
    constexpr int kRow4 = D / 4;
    for (int idx = tid; idx < kFmBKV * kRow4; idx += kFmThreads) {
      const int kk = idx / kRow4, d = (idx % kRow4) * 4;
      const int64_t j = kt0 + kk;
      float4 kv = make_float4(0.0f, 0.0f, 0.0f, 0.0f), vv = kv;
      if (j <= klast) {
        const int64_t off = kv_offset(c, table, j, kvh) + d;
        if (vec4) {
          kv = kv_load4<B16>(c.k, off);
          vv = kv_load4<B16>(c.v, off);
        } else {
          kv = make_float4(kv_load<B16>(c.k, off), kv_load<B16>(c.k, off + 1), kv_load<B16>(c.k, off + 2),
                           kv_load<B16>(c.k, off + 3));
          vv = make_float4(kv_load<B16>(c.v, off), kv_load<B16>(c.v, off + 1), kv_load<B16>(c.v, off + 2),
                           kv_load<B16>(c.v, off + 3));
        }
      }
      *reinterpret_cast<uint2*>(Ks + kk * C::kStride + d) =
          make_uint2(pack_bf16(kv.x, kv.y), pack_bf16(kv.z, kv.w));
      *reinterpret_cast<uint2*>(Vs + kk * C::kStride + d) =
          make_uint2(pack_bf16(vv.x, vv.y), pack_bf16(vv.z, vv.w));
    }
    __syncthreads();
    if (!warp_active || kt0 > warp_pos_last || kt0 + kFmBKV - 1 < warp_first) continue;
    // S = Q·Kᵀ: 16 rows × 64 keys per warp.
    float sc[C::kNS][4];
#pragma unroll
    for (int j = 0; j < C::kNS; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) sc[j][q] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < C::kDK; ++kk) {
#pragma unroll
      for (int nj = 0; nj < C::kNS / 2; ++nj) {
        uint32_t b[4];
        const int key = nj * 16 + (lane & 7) + ((lane >> 4) << 3);
        mma::ldmatrix_x4(b, k_base + 2 * (key * C::kStride + kk * 16 + ((lane >> 3) & 1) * 8));
        mma::mma_bf16(sc[2 * nj], qf[kk], b[0], b[1]);
        mma::mma_bf16(sc[2 * nj + 1], qf[kk], b[2], b[3]);
      }
    }
    // Scale, masks, online softmax (a row's scores are spread over the 4 threads of its quad).
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < C::kNS; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int64_t key = kt0 + j * 8 + 2 * t + e;
          const bool ok = valid[hh] && key <= pos[hh] && (a.window <= 0 || pos[hh] - key < a.window);
          const float v = ok ? sc[j][2 * hh + e] * a.scale : -INFINITY;
          sc[j][2 * hh + e] = v;
          mx = fmaxf(mx, v);
        }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m[hh], mx);
      const float corr = m_new == -INFINITY ? 1.0f : expf(m[hh] - m_new);
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < C::kNS; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float v = sc[j][2 * hh + e];
          const float p = v == -INFINITY ? 0.0f : expf(v - m_new);
          sc[j][2 * hh + e] = p;
          sum += p;
        }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      l[hh] = l[hh] * corr + sum;
      m[hh] = m_new;
#pragma unroll
      for (int nb = 0; nb < C::kNO; ++nb) {
        o[nb][2 * hh] *= corr;
        o[nb][2 * hh + 1] *= corr;
      }
    }
    // O += P·V: the score fragments of keys 16·kk2 .. + 15 are the A fragment of that k16 step.
#pragma unroll
    for (int kk2 = 0; kk2 < kFmBKV / 16; ++kk2) {
      const uint32_t pa[4] = {pack_bf16(sc[2 * kk2][0], sc[2 * kk2][1]),
                              pack_bf16(sc[2 * kk2][2], sc[2 * kk2][3]),
                              pack_bf16(sc[2 * kk2 + 1][0], sc[2 * kk2 + 1][1]),
                              pack_bf16(sc[2 * kk2 + 1][2], sc[2 * kk2 + 1][3])};
#pragma unroll
      for (int nd = 0; nd < C::kNO / 2; ++nd) {
        uint32_t b[4];
        const int key = kk2 * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
        ldmatrix_x4_trans(b, v_base + 2 * (key * C::kStride + nd * 16 + (lane >> 4) * 8));
        mma::mma_bf16(o[2 * nd], pa, b[0], b[1]);
        mma::mma_bf16(o[2 * nd + 1], pa, b[2], b[3]);
      }
    }
  }
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    if (!valid[hh]) continue;
    const float inv = 1.0f / l[hh];
    float* out = a.out + (q_begin + row0 + warp * 16 + g + 8 * hh) * a.ldo + h * D;
#pragma unroll
    for (int nb = 0; nb < C::kNO; ++nb) {
      out[nb * 8 + 2 * t] = o[nb][2 * hh] * inv;
      out[nb * 8 + 2 * t + 1] = o[nb][2 * hh + 1] * inv;
    }
  }
}

template <int D, bool B16>
void launch(const AttentionArgs& a, cudaStream_t st) {
  static const bool configured = [] {
    CUDA_CHECK(cudaFuncSetAttribute(attention_prefill_mma_kernel<D, B16>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, FmCfg<D>::kSmemBytes));
    return true;
  }();
  (void)configured;
  attention_prefill_mma_kernel<D, B16>
      <<<prefill_grid(a), kFmThreads, FmCfg<D>::kSmemBytes, st>>>(a, cache_vec4(a.cache));
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_prefill_mma(const AttentionArgs& a, cudaStream_t st) {
  KERNEL_CHECK(a.cache.head_dim == 64 || a.cache.head_dim == 128,
               "attention: the tensor-core prefill takes head_dim 64 or 128");
  with_cache_type(a.cache, [&](auto b16) {
    if (a.cache.head_dim == 64) {
      launch<64, decltype(b16)::value>(a, st);
    } else {
      launch<128, decltype(b16)::value>(a, st);
    }
  });
}

}  // namespace polylora::kernels::cuda::attention_detail
