// kernels/linear/linear_cpu.cc: the CPU fast path of y = x·Wᵀ + b.
// Few rows (decode): register-tiled AVX2 dot products reading W (F32/F16/BF16, MXFP4: each 32-value block
// decoded to f32 in registers, or INT8: codes widened to f32 in registers, each row's sum times its scale)
// once, parallel over the output features (memory-bandwidth bound). Many rows (prefill): W panels converted
// to f32 into thread-local scratch and multiplied with single-threaded OpenBLAS sgemm, parallel over panels.
// linear_batch runs several independent products (MoE experts) as the tasks of one OpenMP region.
// Must not: allocate per call beyond thread-local scratch; nest OpenMP regions.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "kernels/cpu_simd.h"
#include "kernels/linear/linear.h"

namespace polylora::kernels::cpu {
namespace {

constexpr int64_t kSmallM = 8;                // rows of x up to which the dot-product path runs
constexpr int64_t kRowBlock = 16;             // W rows per task of the dot-product path
constexpr int64_t kMaxPanelRows = 256;        // W rows per sgemm panel, at most ...
constexpr int64_t kMaxPanelFloats = 1 << 18;  // ... and at most this many converted elements (1 MiB)
constexpr int64_t kPrefetchBytes = 0;         // extra distance of the software prefetch

template <DType D>
using Elem = std::conditional_t<D == DType::kF32, float, uint16_t>;

template <DType D>
inline float load1(const Elem<D>* w, int64_t i) {
  if constexpr (D == DType::kF32) {
    return w[i];
  } else if constexpr (D == DType::kBF16) {
    return bf16_to_f32(w[i]);
  } else {
    return f16_to_f32(w[i]);
  }
}

void bias_rows(const LinearArgs& a, int64_t r0, int64_t nr) {
  if (!a.bias) return;
  for (int64_t i = 0; i < a.m; ++i) {
    float* y = a.y + i * a.ldy + r0;
    for (int64_t j = 0; j < nr; ++j) y[j] += a.bias[r0 + j];
  }
}

#if POLYLORA_X86
template <DType D>
POLYLORA_AVX2 inline __m256 load8(const Elem<D>* w) {
  if constexpr (D == DType::kF32) {
    return _mm256_loadu_ps(w);
  } else if constexpr (D == DType::kBF16) {
    return simd::load_bf16(w);
  } else {
    return simd::load_f16(w);
  }
}

// y[mi, r] = x[mi]·w[r] + bias[r] for M rows of x and R consecutive rows of W (row length k).
template <DType D, int M, int R>
POLYLORA_AVX2 void dot_tile(const float* x, int64_t ldx, const Elem<D>* w, int64_t k, float* y, int64_t ldy,
                            const float* bias) {
  __m256 acc[M][R];
#pragma GCC unroll 4
  for (int mi = 0; mi < M; ++mi) {
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) acc[mi][r] = _mm256_setzero_ps();
  }
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    __m256 wv[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      // Rows are short streams (k elements); prefetching the next tile keeps DRAM requests in flight.
      _mm_prefetch(reinterpret_cast<const char*>(w + (R + r) * k + i) + kPrefetchBytes, _MM_HINT_T0);
      wv[r] = load8<D>(w + r * k + i);
    }
#pragma GCC unroll 4
    for (int mi = 0; mi < M; ++mi) {
      __m256 xv = _mm256_loadu_ps(x + mi * ldx + i);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) acc[mi][r] = _mm256_fmadd_ps(xv, wv[r], acc[mi][r]);
    }
  }
  if (i < k) {
    __m256i mask = simd::tail_mask(k - i);
    __m256 wv[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      alignas(32) float tail[8] = {};
      for (int64_t j = i; j < k; ++j) tail[j - i] = load1<D>(w + r * k, j);
      wv[r] = _mm256_load_ps(tail);
    }
#pragma GCC unroll 4
    for (int mi = 0; mi < M; ++mi) {
      __m256 xv = _mm256_maskload_ps(x + mi * ldx + i, mask);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) acc[mi][r] = _mm256_fmadd_ps(xv, wv[r], acc[mi][r]);
    }
  }
#pragma GCC unroll 4
  for (int mi = 0; mi < M; ++mi) {
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) y[mi * ldy + r] = simd::hsum(acc[mi][r]) + (bias ? bias[r] : 0.0f);
  }
}

// The 32 values of one MXFP4 block (16 code bytes, low nibble first) times its scale, as 4 x 8 floats.
POLYLORA_AVX2 inline void decode_mxfp4_block(const uint8_t* q, float scale, __m256 (&out)[4]) {
  const __m256 lut = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
  const __m128i nibble = _mm_set1_epi8(0x0f);
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
  const __m128i lo = _mm_and_si128(b, nibble), hi = _mm_and_si128(_mm_srli_epi16(b, 4), nibble);
  const __m128i c[2] = {_mm_unpacklo_epi8(lo, hi), _mm_unpackhi_epi8(lo, hi)};  // codes 0..15, 16..31
  const __m256 s = _mm256_set1_ps(scale);
  const __m256i sign_bit = _mm256_set1_epi32(8);
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    const __m128i c8 = (j & 1) ? _mm_srli_si128(c[j >> 1], 8) : c[j >> 1];
    const __m256i code = _mm256_cvtepu8_epi32(c8);
    const __m256 v = _mm256_permutevar8x32_ps(lut, code);  // the magnitude: the code's low 3 bits
    const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(code, sign_bit), 28);
    out[j] = _mm256_mul_ps(_mm256_xor_ps(v, _mm256_castsi256_ps(sign)), s);
  }
}

// MXFP4 W: y[mi, r] = x[mi]·w[r] + bias[r] for M rows of x and R consecutive rows of W from row `r0`.
template <int M, int R>
POLYLORA_AVX2 void dot_tile_mxfp4(const float* x, int64_t ldx, const WeightView& w, int64_t r0, float* y,
                                  int64_t ldy, const float* bias) {
  const float* table = mxfp4_scale_table();
  const int64_t k = w.cols, num_blocks = k / kMxfp4BlockSize;
  __m256 acc[M][R];
#pragma GCC unroll 4
  for (int mi = 0; mi < M; ++mi) {
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) acc[mi][r] = _mm256_setzero_ps();
  }
  const uint8_t* codes[R];
  const uint8_t* scales[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    codes[r] = w.mxfp4_codes(r0 + r);
    scales[r] = w.mxfp4_scales(r0 + r);
  }
  for (int64_t b = 0; b < num_blocks; ++b) {
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(codes[r] + (b + 4) * kMxfp4BlockBytes), _MM_HINT_T0);
      __m256 wv[4];
      decode_mxfp4_block(codes[r] + b * kMxfp4BlockBytes, table[scales[r][b]], wv);
#pragma GCC unroll 4
      for (int mi = 0; mi < M; ++mi) {
        const float* xb = x + mi * ldx + b * kMxfp4BlockSize;
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j)
          acc[mi][r] = _mm256_fmadd_ps(_mm256_loadu_ps(xb + 8 * j), wv[j], acc[mi][r]);
      }
    }
  }
#pragma GCC unroll 4
  for (int mi = 0; mi < M; ++mi) {
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) y[mi * ldy + r] = simd::hsum(acc[mi][r]) + (bias ? bias[r] : 0.0f);
  }
}

template <int M, int R>
POLYLORA_AVX2 void dot_rows_mxfp4(const LinearArgs& a, int64_t m0, int64_t r0, int64_t r1) {
  const float* x = a.x + m0 * a.ldx;
  float* y = a.y + m0 * a.ldy;
  int64_t r = r0;
  for (; r + R <= r1; r += R)
    dot_tile_mxfp4<M, R>(x, a.ldx, a.w, r, y + r, a.ldy, a.bias ? a.bias + r : nullptr);
  for (; r < r1; ++r) dot_tile_mxfp4<M, 1>(x, a.ldx, a.w, r, y + r, a.ldy, a.bias ? a.bias + r : nullptr);
}

POLYLORA_AVX2 void dot_block_mxfp4_avx2(const LinearArgs& a, int64_t r0, int64_t r1) {
  for (int64_t m0 = 0; m0 < a.m; m0 += 4) {
    switch (std::min<int64_t>(4, a.m - m0)) {
      case 1:
        dot_rows_mxfp4<1, 4>(a, m0, r0, r1);
        break;
      case 2:
        dot_rows_mxfp4<2, 4>(a, m0, r0, r1);
        break;
      case 3:
        dot_rows_mxfp4<3, 2>(a, m0, r0, r1);
        break;
      default:
        dot_rows_mxfp4<4, 2>(a, m0, r0, r1);
        break;
    }
  }
}

// 8 INT8 codes widened to f32 (exact).
POLYLORA_AVX2 inline __m256 load8_int8(const int8_t* q) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q))));
}

// INT8 W: y[mi, r] = scale[r] · (x[mi]·q[r]) + bias[r] for M rows of x and R consecutive rows of W from row
// `r0` (the codes are exact in f32, so the sum is that of the dequantized products up to rounding).
template <int M, int R>
POLYLORA_AVX2 void dot_tile_int8(const float* x, int64_t ldx, const WeightView& w, int64_t r0, float* y,
                                 int64_t ldy, const float* bias) {
  const int64_t k = w.cols;
  const int8_t* q[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) q[r] = static_cast<const int8_t*>(w.data) + (r0 + r) * k;
  __m256 acc[M][R];
#pragma GCC unroll 4
  for (int mi = 0; mi < M; ++mi) {
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) acc[mi][r] = _mm256_setzero_ps();
  }
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    __m256 wv[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(q[r] + i) + 256, _MM_HINT_T0);
      wv[r] = load8_int8(q[r] + i);
    }
#pragma GCC unroll 4
    for (int mi = 0; mi < M; ++mi) {
      __m256 xv = _mm256_loadu_ps(x + mi * ldx + i);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) acc[mi][r] = _mm256_fmadd_ps(xv, wv[r], acc[mi][r]);
    }
  }
  if (i < k) {
    __m256i mask = simd::tail_mask(k - i);
    __m256 wv[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      alignas(32) float tail[8] = {};
      for (int64_t j = i; j < k; ++j) tail[j - i] = static_cast<float>(q[r][j]);
      wv[r] = _mm256_load_ps(tail);
    }
#pragma GCC unroll 4
    for (int mi = 0; mi < M; ++mi) {
      __m256 xv = _mm256_maskload_ps(x + mi * ldx + i, mask);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) acc[mi][r] = _mm256_fmadd_ps(xv, wv[r], acc[mi][r]);
    }
  }
#pragma GCC unroll 4
  for (int mi = 0; mi < M; ++mi) {
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
      y[mi * ldy + r] = simd::hsum(acc[mi][r]) * w.row_scales[r0 + r] + (bias ? bias[r] : 0.0f);
  }
}

template <int M, int R>
POLYLORA_AVX2 void dot_rows_int8(const LinearArgs& a, int64_t m0, int64_t r0, int64_t r1) {
  const float* x = a.x + m0 * a.ldx;
  float* y = a.y + m0 * a.ldy;
  int64_t r = r0;
  for (; r + R <= r1; r += R)
    dot_tile_int8<M, R>(x, a.ldx, a.w, r, y + r, a.ldy, a.bias ? a.bias + r : nullptr);
  for (; r < r1; ++r) dot_tile_int8<M, 1>(x, a.ldx, a.w, r, y + r, a.ldy, a.bias ? a.bias + r : nullptr);
}

POLYLORA_AVX2 void dot_block_int8_avx2(const LinearArgs& a, int64_t r0, int64_t r1) {
  for (int64_t m0 = 0; m0 < a.m; m0 += 4) {
    switch (std::min<int64_t>(4, a.m - m0)) {
      case 1:
        dot_rows_int8<1, 4>(a, m0, r0, r1);
        break;
      case 2:
        dot_rows_int8<2, 4>(a, m0, r0, r1);
        break;
      case 3:
        dot_rows_int8<3, 2>(a, m0, r0, r1);
        break;
      default:
        dot_rows_int8<4, 2>(a, m0, r0, r1);
        break;
    }
  }
}

template <DType D, int M, int R>
POLYLORA_AVX2 void dot_rows(const LinearArgs& a, int64_t m0, int64_t r0, int64_t r1) {
  const auto* w = static_cast<const Elem<D>*>(a.w.data);
  int64_t k = a.w.cols;
  const float* x = a.x + m0 * a.ldx;
  float* y = a.y + m0 * a.ldy;
  int64_t r = r0;
  for (; r + R <= r1; r += R)
    dot_tile<D, M, R>(x, a.ldx, w + r * k, k, y + r, a.ldy, a.bias ? a.bias + r : nullptr);
  for (; r < r1; ++r) dot_tile<D, M, 1>(x, a.ldx, w + r * k, k, y + r, a.ldy, a.bias ? a.bias + r : nullptr);
}

template <DType D>
POLYLORA_AVX2 void dot_block_avx2(const LinearArgs& a, int64_t r0, int64_t r1) {
  for (int64_t m0 = 0; m0 < a.m; m0 += 4) {
    switch (std::min<int64_t>(4, a.m - m0)) {
      case 1:
        dot_rows<D, 1, 4>(a, m0, r0, r1);
        break;
      case 2:
        dot_rows<D, 2, 4>(a, m0, r0, r1);
        break;
      case 3:
        dot_rows<D, 3, 2>(a, m0, r0, r1);
        break;
      default:
        dot_rows<D, 4, 2>(a, m0, r0, r1);
        break;
    }
  }
}
#endif

// Portable fallback of the dot-product path: converts each W row once, then plain loops.
void dot_block_scalar(const LinearArgs& a, int64_t r0, int64_t r1) {
  thread_local std::vector<float> row;
  int64_t k = a.w.cols;
  row.resize(static_cast<size_t>(k));
  for (int64_t r = r0; r < r1; ++r) {
    a.w.row_to_f32(r, row.data());
    for (int64_t i = 0; i < a.m; ++i) {
      const float* x = a.x + i * a.ldx;
      float acc = 0.0f;
      for (int64_t j = 0; j < k; ++j) acc += x[j] * row[j];
      a.y[i * a.ldy + r] = acc + (a.bias ? a.bias[r] : 0.0f);
    }
  }
}

void dot_block(const LinearArgs& a, int64_t r0, int64_t r1) {
#if POLYLORA_X86
  if (simd::has_avx2()) {
    switch (a.w.dtype) {
      case DType::kF32:
        return dot_block_avx2<DType::kF32>(a, r0, r1);
      case DType::kBF16:
        return dot_block_avx2<DType::kBF16>(a, r0, r1);
      case DType::kF16:
        return dot_block_avx2<DType::kF16>(a, r0, r1);
      case DType::kU8:
        return dot_block_mxfp4_avx2(a, r0, r1);
      case DType::kI8:
        return dot_block_int8_avx2(a, r0, r1);
      case DType::kI32:
      case DType::kI64:
        break;
    }
  }
#endif
  dot_block_scalar(a, r0, r1);
}

// One product's share of a batch: dot-product row blocks (few rows) or sgemm panels (many rows).
struct Plan {
  int64_t rows_per_task = 0;
  int64_t num_tasks = 0;
  bool panels = false;
};

Plan plan(const LinearArgs& a, int64_t threads) {
  int64_t n = a.w.rows, k = a.w.cols;
  if (a.m <= 0 || n <= 0) return {};
  if (a.m <= kSmallM || k == 0) return {kRowBlock, (n + kRowBlock - 1) / kRowBlock, false};
  // Panel height: at most kMaxPanelRows and kMaxPanelFloats, and small enough for 2 panels per thread.
  int64_t rows = std::min(kMaxPanelRows, std::max<int64_t>(16, kMaxPanelFloats / k));
  int64_t fair = ((n + 2 * threads - 1) / (2 * threads) + 15) / 16 * 16;
  rows = std::max<int64_t>(16, std::min(rows, fair));
  return {rows, (n + rows - 1) / rows, true};
}

// Rows [r0, r0 + nr) of W through sgemm: converted (MXFP4, INT8: decoded) to f32 in thread-local scratch
// unless already F32.
void panel(const LinearArgs& a, int64_t r0, int64_t nr) {
  int64_t k = a.w.cols;
  const float* wp = nullptr;
  if (a.w.dtype == DType::kF32) {
    wp = static_cast<const float*>(a.w.data) + r0 * k;
  } else {
    thread_local std::vector<float> scratch;
    if (scratch.size() < static_cast<size_t>(nr * k)) scratch.resize(static_cast<size_t>(nr * k));
    const auto* base = static_cast<const char*>(a.w.data);
    size_t row_bytes = static_cast<size_t>(k) * dtype_size(a.w.dtype);
    for (int64_t r = 0; r < nr; ++r) {
      if (a.w.mxfp4())
        mxfp4_decode_row(a.w.mxfp4_codes(r0 + r), a.w.mxfp4_scales(r0 + r), k, scratch.data() + r * k);
      else if (a.w.int8())
        a.w.row_to_f32(r0 + r, scratch.data() + r * k);
      else
        simd::to_f32(base + (r0 + r) * row_bytes, a.w.dtype, k, scratch.data() + r * k);
    }
    wp = scratch.data();
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(a.m), static_cast<int>(nr),
              static_cast<int>(k), 1.0f, a.x, static_cast<int>(a.ldx), wp, static_cast<int>(k), 0.0f,
              a.y + r0, static_cast<int>(a.ldy));
  bias_rows(a, r0, nr);
}

void run_task(const LinearArgs& a, const Plan& p, int64_t task) {
  int64_t r0 = task * p.rows_per_task, nr = std::min(p.rows_per_task, a.w.rows - r0);
  if (a.w.cols == 0) {
    for (int64_t i = 0; i < a.m; ++i) {
      for (int64_t j = r0; j < r0 + nr; ++j) a.y[i * a.ldy + j] = a.bias ? a.bias[j] : 0.0f;
    }
  } else if (p.panels) {
    panel(a, r0, nr);
  } else {
    dot_block(a, r0, r0 + nr);
  }
}

}  // namespace

void linear_batch(const LinearArgs* args, int64_t count) {
  simd::blas_single_threaded();
  int64_t threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  thread_local std::vector<Plan> plans;
  thread_local std::vector<int64_t> first_task;  // [count + 1] prefix sums of the tasks
  plans.resize(static_cast<size_t>(count));
  first_task.assign(static_cast<size_t>(count + 1), 0);
  double work = 0.0;
  for (int64_t i = 0; i < count; ++i) {
    plans[i] = plan(args[i], threads);
    first_task[i + 1] = first_task[i] + plans[i].num_tasks;
    work += static_cast<double>(args[i].m) * static_cast<double>(args[i].w.rows) *
            static_cast<double>(args[i].w.cols);
  }
  int64_t num_tasks = first_task[count];
  const Plan* pl = plans.data();
  const int64_t* ft = first_task.data();
  bool parallel = threads > 1 && num_tasks > 1 && work >= simd::kMinParallelWork;
#pragma omp parallel for schedule(dynamic, 1) if (parallel)
  for (int64_t t = 0; t < num_tasks; ++t) {
    int64_t i = std::upper_bound(ft, ft + count + 1, t) - ft - 1;
    run_task(args[i], pl[i], t - ft[i]);
  }
}

void linear(const LinearArgs& a) {
  linear_batch(&a, 1);
  if (a.lora_shrink != nullptr) ref::lora_shrink(*a.lora_shrink, a.lora_tmp, a.lora_ld_tmp);
}

}  // namespace polylora::kernels::cpu
