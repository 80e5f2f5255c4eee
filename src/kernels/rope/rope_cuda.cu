// kernels/rope/rope_cuda.cu: CUDA RoPE (rotate half), in place: token = blockIdx.x, its (head, pair) items
// over blockIdx.y and threads, one item per thread (a batch-1 step's 64 heads spread over 16 CTAs; one CTA
// per token took 8.5 us per call on the H200). The angle is the fp32 product pos·inv_freq and cos/sin are
// taken in double, as the reference does, so results match it to rounding.
// rope_kv_write (one launch for what took rope twice, write_kv and, with qk_norm, rms_norm twice): token =
// blockIdx.x, one warp per head of q or of k (kRkvWarps heads per CTA over blockIdx.y); the CTA first puts
// its token's cos/sin table in shared memory; a warp sums its head's squares (q/k norm), then rotates the
// pairs (j, j + half) its lanes own and stores them (q in place, k to its cache slot, F32 or BF16); the k
// warps also copy their head of v to the slot. k's LoRA term is added where k is read (twice with q/k norm).
// Must not: allocate; synchronize the stream.
#include <algorithm>

#include "kernels/attention/attention_cuda_common.cuh"
#include "kernels/cuda_util.cuh"
#include "kernels/lora/lora_fused_cuda.cuh"
#include "kernels/rope/rope.h"
#include "kernels/tuning.h"

namespace polylora::kernels::cuda {
namespace {

using attention_detail::kv_store;

__global__ void rope_kernel(float* x, int64_t ldx, int64_t num_heads, int64_t head_dim,
                            const int32_t* positions, const float* inv_freq, float scaling) {
  int64_t t = blockIdx.x;
  int64_t half = head_dim / 2;
  float pos = static_cast<float>(positions[t]);
  for (int64_t i = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; i < num_heads * half;
       i += static_cast<int64_t>(gridDim.y) * blockDim.x) {
    int64_t h = i / half, j = i % half;
    float angle = pos * inv_freq[j];
    double s, c;
    sincos(static_cast<double>(angle), &s, &c);
    float cf = static_cast<float>(c) * scaling, sf = static_cast<float>(s) * scaling;
    float* xh = x + t * ldx + h * head_dim;
    float x1 = xh[j], x2 = xh[j + half];
    xh[j] = x1 * cf - x2 * sf;
    xh[j + half] = x2 * cf + x1 * sf;
  }
}

constexpr int kRkvWarps = 4;      // heads per CTA (a warp each) for steps of few tokens
constexpr int kRkvLoopWarps = 8;  // warps per CTA when one CTA takes all of a token's heads
constexpr int kRkvBatch = 4;      // plain heads a warp loads before it stores (rope_kv_write_kernel)

// Grid (m, ⌈(num_heads + num_kv_heads) / kRkvWarps⌉), kRkvWarps·32 threads: a warp per head; or, for steps
// of from KernelTuning::rope_kv_write_loop_min_rows tokens (prefill), grid (m, 1) with kRkvLoopWarps·32
// threads, each warp looping over the token's heads (the token's cos/sin computed once, not once per 4
// heads, and 18x fewer CTAs for GPT-OSS-20B's 72 heads: session 54's H100 trace of a 16 x 512-token prefill
// had this kernel at 0.6 ms per layer for ~0.1 ms of traffic). 2·(head_dim / 2) floats of dynamic shared
// memory. Heads [0, num_heads) are q's, the rest k's (and v's).
// b_regs (KernelTuning::rope_lora_b_regs; head_dim a multiple of 64 up to 128): each lane loads the B rows
// of its LoRA outputs (head · head_dim + lane + 32·i) into registers before pdl_wait where they fit
// (lora_fused::load_b_regs), so after the wait only the shrink sums are read; the same sums, bit for bit.
template <bool B16>
__global__ void rope_kv_write_kernel(RopeKvWriteArgs a, bool b_regs) {
  extern __shared__ float cs[];  // cos [half], then sin [half]
  const int64_t t = blockIdx.x, d = a.head_dim, half = d / 2;
  // Before waiting on the previous kernel (q/k/v's product), what step inputs and weights alone give (no
  // kernel of the step writes them): the rotation's cos and sin, and the LoRA terms' slots, scales and B
  // rows (into L2; lora_fused::prefetch_b_rows).
  const float pos = static_cast<float>(a.positions[t]);
  for (int64_t j = threadIdx.x; j < half; j += blockDim.x) {
    double s, c;
    sincos(static_cast<double>(pos * a.inv_freq[j]), &s, &c);
    cs[j] = static_cast<float>(c) * a.attention_scaling;
    cs[half + j] = static_cast<float>(s) * a.attention_scaling;
  }
  const int warps = static_cast<int>(blockDim.x >> 5);
  const int64_t heads = a.num_heads + a.num_kv_heads, stride = static_cast<int64_t>(gridDim.y) * warps;
  int64_t head = static_cast<int64_t>(blockIdx.y) * warps + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  lora_fused::ExpandToken tq, tk, tv;
  // B rows in registers: b0 for q (q heads) or k (k/v heads), b1 for v; r0 / r1 whether they are there.
  const int per_lane = static_cast<int>(d / 32);
  uint4 b0[lora_fused::kExpandRegs], b1[lora_fused::kExpandRegs];
  bool r0 = false, r1 = false;
  // The token's term of module l (outputs o0 ..): its slot and scale, and its B rows into registers where
  // they fit, else into L2. Returns whether they are in registers.
  auto stage = [&](const LoraExpandIn& l, lora_fused::ExpandToken& tok, int64_t o0,
                   uint4(&regs)[lora_fused::kExpandRegs]) {
    tok = lora_fused::expand_token(l, t);
    const bool in_regs =
        b_regs && lora_fused::expand_regs_fit(l, per_lane) && (reinterpret_cast<uintptr_t>(tok.b) & 15) == 0;
    if (in_regs)
      lora_fused::load_b_regs(l, tok, o0, per_lane, lane, regs);
    else
      lora_fused::prefetch_b_rows(l, tok, o0, d, lane, 32);
    return in_regs;
  };
  // The LoRA terms of a head (the warp's first before the wait: weights and step inputs only).
  auto stage_head = [&](int64_t hd) {
    r0 = r1 = false;
    if (hd < a.num_heads) {
      if (a.lora_q.active()) r0 = stage(a.lora_q, tq, hd * d, b0);
    } else if (hd < heads) {
      const int64_t h = hd - a.num_heads;
      if (a.lora_k.active()) r0 = stage(a.lora_k, tk, h * d, b0);
      if (a.lora_v.active()) r1 = stage(a.lora_v, tv, h * d, b1);
    }
  };
  stage_head(head);
  // The term of output o0 + j (j = lane + 32·i) of module l, from the registers or through expand_at.
  auto term = [&](const LoraExpandIn& l, const lora_fused::ExpandToken& tok, bool in_regs,
                  const uint4(&regs)[lora_fused::kExpandRegs], int64_t o0, int64_t j) {
    return in_regs ? lora_fused::expand_regs(l, tok, regs, static_cast<int>(j >> 5))
                   : lora_fused::expand_at(l, tok, o0 + j);
  };
  cuda_util::pdl_begin();  // launched by launch_pdl (cuda_util.cuh)
  __syncthreads();
  // One head (whole warps; a return moves on to the warp's next head).
  auto process = [&](int64_t head) {
    const float* src;          // q: its row, rotated in place; k: its input row
    float* qdst = nullptr;     // q's row
    void* kc = nullptr;        // k: the cache's K array (F32 or BF16) ...
    int64_t koff = 0, kh = 0;  // ... and the head's first element there; k's head
    const float* norm_w;
    bool klora = false;  // k + its LoRA term (computed where read: nothing is staged in the cache)
    bool qlora = false;  // q + its LoRA term where read (no norm: each element read once)
    if (head < a.num_heads) {
      qdst = a.q + t * a.ldq + head * d;
      src = qdst;
      norm_w = a.q_norm;
      if (a.lora_q.active() && norm_w != nullptr) {
        // q += its LoRA term, in place (each lane its own elements), before the norm reads every element
        // twice; the same floats as adding it where read.
        for (int64_t j = lane; j < d; j += 32) qdst[j] += term(a.lora_q, tq, r0, b0, head * d, j);
        __syncwarp();
      } else {
        qlora = a.lora_q.active();
      }
    } else {
      const int64_t slot = a.slot_mapping[t];
      if (slot < 0) return;  // padding: nothing of k or v is stored
      kh = head - a.num_heads;
      const int64_t kv_row = a.num_kv_heads * d;
      src = a.k + t * a.ldk + kh * d;
      kc = a.cache.k;
      koff = slot * kv_row + kh * d;
      norm_w = a.k_norm;
      const float* vs = a.v + t * a.ldv + kh * d;
      if (a.lora_v.active()) {
        for (int64_t j = lane; j < d; j += 32)
          kv_store<B16>(a.cache.v, koff + j, vs[j] + term(a.lora_v, tv, r1, b1, kh * d, j));
      } else {
        for (int64_t j = lane; j < d; j += 32) kv_store<B16>(a.cache.v, koff + j, vs[j]);
      }
      klora = a.lora_k.active();
    }
    // Element j of the head before the norm and rotation.
    auto x_of = [&](int64_t j) {
      float x = src[j];
      if (klora) x += term(a.lora_k, tk, r0, b0, kh * d, j);
      if (qlora) x += term(a.lora_q, tq, r0, b0, head * d, j);
      return x;
    };
    auto put = [&](int64_t j, float v) {
      if (qdst != nullptr) {
        qdst[j] = v;
      } else {
        kv_store<B16>(kc, koff + j, v);
      }
    };
    const bool odd = (d & 1) != 0;  // the last element of an odd head is normed, never rotated
    float inv = 1.0f;
    if (norm_w) {
      float sum = 0.0f;
      for (int64_t j = lane; j < half; j += 32) {
        const float x1 = x_of(j), x2 = x_of(j + half);
        sum += x1 * x1 + x2 * x2;
      }
      if (odd && lane == 0) {
        const float x = x_of(d - 1);
        sum += x * x;
      }
      sum = cuda_util::warp_sum(sum);
      inv = 1.0f / sqrtf(sum / static_cast<float>(d) + a.eps);
    }
    // Every lane reads its own elements before it writes them, so q in place (src == qdst) is safe.
    for (int64_t j = lane; j < half; j += 32) {
      float x1 = x_of(j), x2 = x_of(j + half);
      if (norm_w) {
        x1 = norm_w[j] * (x1 * inv);
        x2 = norm_w[j + half] * (x2 * inv);
      }
      const float c = cs[j], s = cs[half + j];
      put(j, x1 * c - x2 * s);
      put(j + half, x2 * c + x1 * s);
    }
    if (odd && lane == 0) {
      const float x = x_of(d - 1);
      put(d - 1, norm_w ? norm_w[d - 1] * (x * inv) : x);
    }
  };
  // Plain heads (no norm, no LoRA term, head_dim 64: each lane one rotation pair per head, GPT-OSS's
  // prefill): kRkvBatch of the warp's heads at a time, every load issued before the first store, so a warp's
  // loads overlap instead of each head waiting a memory round trip (q rows are rotated in place and a head's
  // elements are its own: loading later heads before earlier stores reads what the one-head loop reads).
  const bool plain =
      a.q_norm == nullptr && !a.lora_q.active() && !a.lora_k.active() && !a.lora_v.active() && d == 64;
  if (plain) {
    const float c = cs[lane], sn = cs[32 + lane];
    const int64_t slot = a.slot_mapping[t], kv_row = a.num_kv_heads * d;
    for (; head < heads; head += kRkvBatch * stride) {
      float x1[kRkvBatch], x2[kRkvBatch], v1[kRkvBatch], v2[kRkvBatch];
#pragma unroll
      for (int u = 0; u < kRkvBatch; ++u) {
        const int64_t h = head + u * stride;
        x1[u] = x2[u] = v1[u] = v2[u] = 0.0f;
        if (h >= heads) continue;
        const float* src;
        if (h < a.num_heads) {
          src = a.q + t * a.ldq + h * d;
        } else {
          if (slot < 0) continue;  // padding: nothing of k or v is stored
          src = a.k + t * a.ldk + (h - a.num_heads) * d;
          const float* vs = a.v + t * a.ldv + (h - a.num_heads) * d;
          v1[u] = vs[lane];
          v2[u] = vs[lane + 32];
        }
        x1[u] = src[lane];
        x2[u] = src[lane + 32];
      }
#pragma unroll
      for (int u = 0; u < kRkvBatch; ++u) {
        const int64_t h = head + u * stride;
        if (h >= heads) continue;
        const float r1 = x1[u] * c - x2[u] * sn, r2 = x2[u] * c + x1[u] * sn;
        if (h < a.num_heads) {
          float* q = a.q + t * a.ldq + h * d;
          q[lane] = r1;
          q[lane + 32] = r2;
        } else if (slot >= 0) {
          const int64_t koff = slot * kv_row + (h - a.num_heads) * d;
          kv_store<B16>(a.cache.k, koff + lane, r1);
          kv_store<B16>(a.cache.k, koff + lane + 32, r2);
          kv_store<B16>(a.cache.v, koff + lane, v1[u]);
          kv_store<B16>(a.cache.v, koff + lane + 32, v2[u]);
        }
      }
    }
    return;
  }
  for (bool first = true; head < heads; head += stride, first = false) {
    if (!first) stage_head(head);
    process(head);
  }
}

}  // namespace

void rope_kv_write(const RopeKvWriteArgs& a, const CudaContext& ctx) {
  if (a.m == 0) return;
  KERNEL_CHECK(a.cache.num_kv_heads == a.num_kv_heads && a.cache.head_dim == a.head_dim,
               "rope_kv_write: the cache's heads or head_dim differ from k/v's");
  KERNEL_CHECK((a.q_norm == nullptr) == (a.k_norm == nullptr),
               "rope_kv_write: q_norm and k_norm go together");
  KERNEL_CHECK(a.m < (1LL << 31), "rope_kv_write: too many tokens for one grid");
  const int64_t heads = a.num_heads + a.num_kv_heads;
  const int64_t loop_from = kernel_tuning(TuningShape{}).rope_kv_write_loop_min_rows;
  const bool loop = loop_from > 0 && a.m >= loop_from;
  const dim3 grid(static_cast<unsigned>(a.m),
                  loop ? 1u : static_cast<unsigned>((heads + kRkvWarps - 1) / kRkvWarps));
  const int threads = (loop ? kRkvLoopWarps : kRkvWarps) * 32;
  const size_t smem = static_cast<size_t>(2 * (a.head_dim / 2)) * sizeof(float);
  // Lane j's outputs are lane + 32·i only when head_dim is a multiple of 64 (odd heads and other halves
  // take expand_at).
  const bool b_regs = kernel_tuning(TuningShape{}).rope_lora_b_regs != 0 && a.head_dim % 64 == 0 &&
                      a.head_dim <= 32 * lora_fused::kExpandRegs;
  attention_detail::with_cache_type(a.cache, [&](auto b16) {
    cuda_util::launch_pdl(rope_kv_write_kernel<decltype(b16)::value>, grid, threads, smem,
                          cuda_util::stream(ctx), a, b_regs);
  });
  CUDA_CHECK_LAUNCH();
}

void rope(const RopeArgs& a, const CudaContext& ctx) {
  if (a.m == 0) return;
  // Few tokens (decode): the items over up to ⌈items / 128⌉ CTAs per token, about 64 CTAs in all.
  const int64_t items = a.num_heads * (a.head_dim / 2);
  const int64_t per_token = a.m >= 64 ? 1 : std::min<int64_t>((items + 127) / 128, (64 + a.m - 1) / a.m);
  const dim3 grid(static_cast<unsigned>(a.m), static_cast<unsigned>(std::max<int64_t>(1, per_token)));
  rope_kernel<<<grid, 128, 0, cuda_util::stream(ctx)>>>(a.x, a.ldx, a.num_heads, a.head_dim, a.positions,
                                                        a.inv_freq, a.attention_scaling);
  CUDA_CHECK_LAUNCH();
}

}  // namespace polylora::kernels::cuda
