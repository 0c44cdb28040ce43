// Grouped linear layers for agents.nets.StackedActors: the rows of net g, and only those, times
// net g's weights, for every net in one call, with the bias and ReLU fused. Three kernels, one per
// kind of CPU (agents/kernels.py picks, per dtype, the first this CPU runs):
//   * "amx": bf16 on oneDNN's BRGeMM micro-kernels (AMX tiles) that ship inside libtorch
//     (at::native::cpublas): grouped_linear, pack_weights;
//   * "avx512bf16": bf16 on our own vdpbf16ps micro-kernel: grouped_linear_avx512bf16,
//     pack_weights_avx512bf16;
//   * "avx2": float32 on our own FMA micro-kernel: grouped_linear_avx2, pack_weights_avx2.
//
// Why not torch.baddbmm: it pads every net's rows to the largest group (~2x the products at a
// self-play step's PFSP-skewed group sizes), and each of its per-net products re-lays the weights
// out (~15 us per 256x256 layer before a row counts, measured). Here the weights are packed once,
// when the stack is built, and each group runs in blocks of its own rows.
//
// Built on first use by agents/kernels.py (torch.utils.cpp_extension); serial on purpose: the
// runners act with one torch thread each. The AVX512 and AVX2 code is compiled for its target
// function by function and only called where __builtin_cpu_supports says the CPU has it.

#include <ATen/core/Tensor.h>
#include <ATen/native/CPUBlas.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace {

namespace cpublas = at::native::cpublas;

// Rows per micro-kernel call and output columns per packed panel (the fastest pair measured for
// 16 nets of 256x256 at 45-200 rows each; the ukernel takes N <= 64 per call).
constexpr int64_t kBlockRows = 32;
constexpr int64_t kPanel = 32;

int64_t padded_width(int64_t n) { return (n + kPanel - 1) / kPanel * kPanel; }

// oneDNN packs bf16 for AMX tiles; store_rows needs AVX512-BF16 (every CPU with AMX has it).
bool could_pack() { return cpublas::could_pack(at::kBFloat16) && __builtin_cpu_supports("avx512bf16"); }

// weights [G, K, N] bf16 (in x out) -> [G, padded N / kPanel, K, kPanel] in the ukernel's VNNI
// layout, the columns past N zero.
at::Tensor pack_weights(const at::Tensor& weights) {
  TORCH_CHECK(could_pack(), "this CPU has no bf16 BRGeMM packing (AMX); use the baddbmm stack");
  TORCH_CHECK(weights.dim() == 3 && weights.scalar_type() == at::kBFloat16,
              "pack_weights wants bf16 weights [nets, in, out], got ", weights.sizes(), " ", weights.scalar_type());
  const int64_t groups = weights.size(0), k = weights.size(1), n = weights.size(2);
  TORCH_CHECK(k % 2 == 0, "pack_weights wants an even input width (VNNI pairs), got ", k);
  const int64_t np = padded_width(n);
  at::Tensor wide = at::zeros({groups, k, np}, weights.options());
  wide.narrow(2, 0, n).copy_(weights);
  at::Tensor packed = at::empty({groups, np / kPanel, k, kPanel}, weights.options());
  const uint16_t* in = reinterpret_cast<const uint16_t*>(wide.data_ptr());
  uint16_t* out = reinterpret_cast<uint16_t*>(packed.data_ptr());
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t p = 0; p < np; p += kPanel)
      cpublas::pack(k, kPanel, np, kPanel, at::kBFloat16, at::kBFloat16,
                    in + g * k * np + p, out + g * np * k + p * k);
  return packed;
}

#define LUDUS_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#define LUDUS_AVX2_TARGET __attribute__((target("avx2,fma")))

// y[lanes in `in`] = bf16(act(sum + bias)), the store of both bf16 kernels: the float -> bf16
// conversion is the CPU's (round to nearest even; denormals flush to zero), and the ReLU keeps a
// NaN and turns -0 into +0.
LUDUS_BF16_TARGET inline __attribute__((always_inline)) void store_bf16(__m512 sum, __m512 bias, bool relu,
                                                                        __mmask16 in, uint16_t* y) {
  __m512 v = _mm512_add_ps(sum, bias);
  if (relu)
    v = _mm512_maskz_mov_ps(
        _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_GT_OQ) | _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), v);
  _mm256_mask_storeu_epi16(y, in, reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
}

// y[i, j] = bf16(act(c[i, j] + bias[j])) for a block of rows, 16 columns at a time.
LUDUS_BF16_TARGET void store_rows(const float* c, int64_t rows, int64_t ldc, const float* bias, int64_t n, bool relu,
                                  uint16_t* y) {
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < n; j += 16) {
      const __mmask16 in = n - j >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - j)) - 1);
      store_bf16(_mm512_maskz_loadu_ps(in, c + i * ldc + j), _mm512_maskz_loadu_ps(in, bias + j), relu, in,
                 y + i * n + j);
    }
  }
}

// The checks every grouped call makes; the total row count.
int64_t check_grouped(const at::Tensor& x, at::IntArrayRef counts, int64_t groups, int64_t k, at::ScalarType dtype,
                      const at::Tensor& bias, int64_t n, int64_t np) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == dtype && x.is_contiguous(),
              "grouped_linear wants contiguous ", dtype, " rows [rows, in], got ", x.sizes(), " ", x.scalar_type());
  TORCH_CHECK(static_cast<int64_t>(counts.size()) == groups, counts.size(), " row counts for ", groups, " nets");
  TORCH_CHECK(x.size(1) == k, "rows of width ", x.size(1), " for weights of input width ", k);
  TORCH_CHECK(n > 0 && n <= np, "output width ", n, " for weights of padded width ", np);
  TORCH_CHECK(bias.dim() == 2 && bias.size(0) == groups && bias.size(1) == n && bias.scalar_type() == at::kFloat &&
              bias.is_contiguous(), "grouped_linear wants float32 biases [nets, out]");
  int64_t total = 0;
  for (int64_t count : counts) {
    TORCH_CHECK(count >= 0, "a negative row count");
    total += count;
  }
  TORCH_CHECK(total == x.size(0), "row counts sum to ", total, " for ", x.size(0), " rows");
  return total;
}

// y[r] = act(x[r] @ W[g] + b[g]) for the rows r of group g: the groups' rows are contiguous in
// x, in order, counts[g] of them. x [rows, K] bf16; packed from pack_weights; bias [G, N] float32.
at::Tensor grouped_linear(const at::Tensor& x, at::IntArrayRef counts, const at::Tensor& packed,
                          const at::Tensor& bias, int64_t n, bool relu) {
  TORCH_CHECK(packed.dim() == 4 && packed.scalar_type() == at::kBFloat16 && packed.is_contiguous(),
              "grouped_linear wants weights from pack_weights");
  const int64_t groups = packed.size(0), k = packed.size(2), np = packed.size(1) * kPanel;
  const int64_t total = check_grouped(x, counts, groups, k, at::kBFloat16, bias, n, np);
  at::Tensor y = at::empty({total, n}, x.options());
  if (total == 0) return y;
  std::vector<float> c(kBlockRows * np);
  const auto* xs = reinterpret_cast<const at::BFloat16*>(x.data_ptr());
  const auto* ws = reinterpret_cast<const at::BFloat16*>(packed.data_ptr());
  const float* bs = bias.data_ptr<float>();
  auto* ys = reinterpret_cast<uint16_t*>(y.data_ptr());
  int64_t row = 0;
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t start = 0; start < counts[g]; start += kBlockRows) {
      const int64_t m = std::min(kBlockRows, counts[g] - start);
      for (int64_t p = 0; p < np; p += kPanel)
        cpublas::brgemm(m, kPanel, k, k, kPanel, np, /*add_C=*/false, xs + (row + start) * k,
                        ws + g * np * k + p * k, c.data() + p, /*is_vnni=*/true);
      store_rows(c.data(), m, np, bs + g * n, n, relu, ys + (row + start) * n);
    }
    row += counts[g];
  }
  cpublas::brgemm_release(/*is_vnni=*/true);  // hand the tiles back to the rest of torch
  return y;
}


// ---------------------------------------------------------------------------------------------
// Micro-kernels of our own for CPUs without AMX tiles: AVX512-BF16 for bf16 nets (vdpbf16ps: a
// pair of bf16 products added into each float32 lane) and AVX2/FMA for float32 nets. A tile of
// kRows rows by up to kVecs column vectors keeps its float32 sums in registers over the whole input
// width (per input: one load of each weight vector, one broadcast per row), then adds the bias,
// applies the ReLU and stores (bf16: store_bf16, as the AMX kernel does). The weights are
// packed once, in panels of kVecs vectors: the panel at column j0 of net g holds its columns in
// the order the tile reads them (input, then column) at g * k_rows * np + j0 * k_rows words, with
// np the output width rounded up to a vector and k_rows the input width (float32) or its pairs
// rounded up (bf16, VNNI: one 32-bit word holds inputs 2i and 2i+1 of a column; an odd last
// input is paired with a zero). Every group runs its own rows only, a row block through every panel
// before the next block (the block's inputs stay in L1, the net's weights in L2).
//
// Measured here (Zen 4, AVX512-BF16, no AMX; one thread, beside another job) on 40 recorded
// self-play steps of the connect-four preset's stack (16 nets, 126 -> 256 -> 256 -> 7, ~1,600
// rows a step, 45-200 per net): bf16 1.7 ms a step against 4.6 for baddbmm + ReLU padded to the
// largest group (2.7x; ~190 GFLOP/s of useful products, about the core's vdpbf16ps peak), float32
// 3.6 ms against 5.1 for one F.linear per net (1.4x) and 9.9 for the float32 baddbmm. Tiles of
// 6x64, 8x48 and 12x32 bf16 (6x16, 4x24 float32), and looping panels outside the row blocks,
// were all within 5% of each other.

constexpr int kBf16Rows = 6;
constexpr int kBf16Vecs = 4;  // of 16 columns: 24 accumulators, 4 weight vectors, 1 broadcast
constexpr int kF32Rows = 6;
constexpr int kF32Vecs = 2;   // of 8 columns: 12 accumulators (ymm), 2 weight vectors, 1 broadcast

bool has_avx512bf16() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
}
bool has_avx2_fma() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }

// Which of the kernels this CPU runs: "amx", "avx512bf16", "avx2".
std::vector<std::string> kernel_paths() {
  std::vector<std::string> paths;
  if (could_pack()) paths.push_back("amx");
  if (has_avx512bf16()) paths.push_back("avx512bf16");
  if (has_avx2_fma()) paths.push_back("avx2");
  return paths;
}

template <int M, int V>
LUDUS_BF16_TARGET void tile_bf16(const uint16_t* x, int64_t k, const int32_t* w, const float* bias, int64_t cols,
                                 bool relu, uint16_t* y, int64_t ldy) {
  __m512 acc[M][V];
  #pragma GCC unroll 32
  for (int i = 0; i < M; ++i)
    #pragma GCC unroll 32
    for (int v = 0; v < V; ++v) acc[i][v] = _mm512_setzero_ps();
  const int64_t pairs = k / 2;
  for (int64_t p = 0; p < pairs; ++p) {
    __m512bh b[V];
    #pragma GCC unroll 32
    for (int v = 0; v < V; ++v) b[v] = (__m512bh)_mm512_loadu_si512(w + p * V * 16 + v * 16);
    #pragma GCC unroll 32
    for (int i = 0; i < M; ++i) {
      int32_t pair;
      std::memcpy(&pair, x + i * k + 2 * p, sizeof pair);
      const __m512bh a = (__m512bh)_mm512_set1_epi32(pair);
      #pragma GCC unroll 32
      for (int v = 0; v < V; ++v) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], a, b[v]);
    }
  }
  if (k % 2) {  // the last input alone, paired with a zero (its packed weights are (w, 0) too)
    __m512bh b[V];
    #pragma GCC unroll 32
    for (int v = 0; v < V; ++v) b[v] = (__m512bh)_mm512_loadu_si512(w + pairs * V * 16 + v * 16);
    #pragma GCC unroll 32
    for (int i = 0; i < M; ++i) {
      const __m512bh a = (__m512bh)_mm512_set1_epi32(static_cast<int32_t>(x[i * k + k - 1]));
      #pragma GCC unroll 32
      for (int v = 0; v < V; ++v) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], a, b[v]);
    }
  }
  #pragma GCC unroll 32
  for (int v = 0; v < V; ++v) {
    const int64_t left = cols - v * 16;
    if (left <= 0) break;
    const __mmask16 in = left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1);
    const __m512 b = _mm512_maskz_loadu_ps(in, bias + v * 16);
    #pragma GCC unroll 32
    for (int i = 0; i < M; ++i) store_bf16(acc[i][v], b, relu, in, y + i * ldy + v * 16);
  }
}

template <int M, int V>
LUDUS_AVX2_TARGET void tile_f32(const float* x, int64_t k, const float* w, const float* bias, int64_t cols,
                                bool relu, float* y, int64_t ldy) {
  __m256 acc[M][V];
  #pragma GCC unroll 32
  for (int i = 0; i < M; ++i)
    #pragma GCC unroll 32
    for (int v = 0; v < V; ++v) acc[i][v] = _mm256_setzero_ps();
  for (int64_t p = 0; p < k; ++p) {
    __m256 b[V];
    #pragma GCC unroll 32
    for (int v = 0; v < V; ++v) b[v] = _mm256_loadu_ps(w + p * V * 8 + v * 8);
    #pragma GCC unroll 32
    for (int i = 0; i < M; ++i) {
      const __m256 a = _mm256_broadcast_ss(x + i * k + p);
      #pragma GCC unroll 32
      for (int v = 0; v < V; ++v) acc[i][v] = _mm256_fmadd_ps(a, b[v], acc[i][v]);
    }
  }
  const __m256 zero = _mm256_setzero_ps();
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  #pragma GCC unroll 32
  for (int v = 0; v < V; ++v) {
    const int64_t left = cols - v * 8;
    if (left <= 0) break;
    const __m256i in = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::min<int64_t>(left, 8))), lane);
    const __m256 b = _mm256_maskload_ps(bias + v * 8, in);
    #pragma GCC unroll 32
    for (int i = 0; i < M; ++i) {
      __m256 s = _mm256_add_ps(acc[i][v], b);
      if (relu)  // keeps a NaN (unordered) and turns -0 into +0, as the bf16 store does
        s = _mm256_and_ps(s, _mm256_or_ps(_mm256_cmp_ps(s, zero, _CMP_GT_OQ), _mm256_cmp_ps(s, s, _CMP_UNORD_Q)));
      if (left >= 8)
        _mm256_storeu_ps(y + i * ldy + v * 8, s);
      else
        _mm256_maskstore_ps(y + i * ldy + v * 8, in, s);
    }
  }
}

// The tile for m rows (1..R) and v column vectors (1..VR), as a table of instantiations.
template <typename F, template <int, int> class Tile, int R, int VR>
struct TileTable {
  F table[R][VR];
  template <int M, int V>
  void fill() {
    table[M - 1][V - 1] = &Tile<M, V>::run;
    if constexpr (V < VR) fill<M, V + 1>();
    else if constexpr (M < R) fill<M + 1, 1>();
  }
  TileTable() { fill<1, 1>(); }
};

template <int M, int V>
struct Bf16Tile {
  static void run(const uint16_t* x, int64_t k, const int32_t* w, const float* bias, int64_t cols, bool relu,
                  uint16_t* y, int64_t ldy) { tile_bf16<M, V>(x, k, w, bias, cols, relu, y, ldy); }
};
template <int M, int V>
struct F32Tile {
  static void run(const float* x, int64_t k, const float* w, const float* bias, int64_t cols, bool relu,
                  float* y, int64_t ldy) { tile_f32<M, V>(x, k, w, bias, cols, relu, y, ldy); }
};
using Bf16Fn = void (*)(const uint16_t*, int64_t, const int32_t*, const float*, int64_t, bool, uint16_t*, int64_t);
using F32Fn = void (*)(const float*, int64_t, const float*, const float*, int64_t, bool, float*, int64_t);

// weights [G, K, N] (in x out) -> panels as described above, np = N rounded up to `lanes`
// columns, panels `lanes * vecs` wide; `pair` 2 packs VNNI pairs (bf16), 1 single values (float32).
at::Tensor pack_panels(const at::Tensor& weights, int64_t lanes, int64_t vecs, int64_t pair) {
  const int64_t groups = weights.size(0), k = weights.size(1), n = weights.size(2);
  const int64_t np = (n + lanes - 1) / lanes * lanes, k_rows = (k + pair - 1) / pair, panel = lanes * vecs;
  at::Tensor wide = at::zeros({groups, k_rows * pair, np}, weights.options());  // zeros past K and N
  wide.narrow(1, 0, k).narrow(2, 0, n).copy_(weights);
  // [G, k_rows, np, pair]: a word holds a column's inputs (pair * r, ..., pair * r + pair - 1)
  const at::Tensor words = wide.view({groups, k_rows, pair, np}).permute({0, 1, 3, 2});
  const int64_t full = np / panel * panel;  // the full panels, then one narrower
  at::Tensor packed = at::empty({groups, k_rows, np * pair}, weights.options());
  at::Tensor flat = packed.view({groups, k_rows * np * pair});
  flat.narrow(1, 0, k_rows * full * pair)
      .view({groups, full / panel, k_rows, panel, pair})
      .copy_(words.narrow(2, 0, full).reshape({groups, k_rows, full / panel, panel, pair})
                 .permute({0, 2, 1, 3, 4}));
  if (full < np)
    flat.narrow(1, k_rows * full * pair, k_rows * (np - full) * pair)
        .view({groups, k_rows, np - full, pair})
        .copy_(words.narrow(2, full, np - full));
  return packed;
}

at::Tensor pack_weights_avx512bf16(const at::Tensor& weights) {
  TORCH_CHECK(has_avx512bf16(), "this CPU has no AVX512-BF16; use the baddbmm stack");
  TORCH_CHECK(weights.dim() == 3 && weights.scalar_type() == at::kBFloat16,
              "pack_weights_avx512bf16 wants bf16 weights [nets, in, out], got ", weights.sizes(), " ",
              weights.scalar_type());
  return pack_panels(weights, 16, kBf16Vecs, 2);
}

at::Tensor pack_weights_avx2(const at::Tensor& weights) {
  TORCH_CHECK(has_avx2_fma(), "this CPU has no AVX2 with FMA; use the baddbmm stack");
  TORCH_CHECK(weights.dim() == 3 && weights.scalar_type() == at::kFloat,
              "pack_weights_avx2 wants float32 weights [nets, in, out], got ", weights.sizes(), " ",
              weights.scalar_type());
  return pack_panels(weights, 8, kF32Vecs, 1);
}

// Runs every group's rows through its panels with `tiles` (R rows x up to VR vectors of `lanes`).
template <typename T, typename W, typename Fn, int R, int VR>
void run_groups(const T* xs, int64_t k, at::IntArrayRef counts, const W* ws, int64_t k_rows, int64_t np,
                int64_t lanes, const float* bs, int64_t n, bool relu, T* ys, const Fn (&tiles)[R][VR]) {
  const int64_t panel = lanes * VR;
  int64_t row = 0;
  for (int64_t g = 0; g < static_cast<int64_t>(counts.size()); ++g) {
    const int64_t count = counts[g];
    const W* wg = ws + g * k_rows * np;
    auto one = [&](int64_t start, int64_t j0) {
      const int64_t m = std::min<int64_t>(R, count - start);
      const int64_t vecs = std::min<int64_t>(VR, (np - j0) / lanes);
      tiles[m - 1][vecs - 1](xs + (row + start) * k, k, wg + j0 * k_rows, bs + g * n + j0, n - j0, relu,
                             ys + (row + start) * n + j0, n);
    };
    for (int64_t start = 0; start < count; start += R)
      for (int64_t j0 = 0; j0 < np; j0 += panel) one(start, j0);
    row += count;
  }
}

at::Tensor grouped_linear_avx512bf16(const at::Tensor& x, at::IntArrayRef counts, const at::Tensor& packed,
                                     const at::Tensor& bias, int64_t n, bool relu) {
  TORCH_CHECK(has_avx512bf16(), "this CPU has no AVX512-BF16; use the baddbmm stack");
  TORCH_CHECK(packed.dim() == 3 && packed.scalar_type() == at::kBFloat16 && packed.is_contiguous(),
              "grouped_linear_avx512bf16 wants weights from pack_weights_avx512bf16");
  const int64_t groups = packed.size(0), k_rows = packed.size(1), np = packed.size(2) / 2;
  TORCH_CHECK(x.dim() == 2, "grouped_linear wants contiguous bf16 rows [rows, in], got ", x.sizes());
  const int64_t k = x.size(1);  // pairs of inputs hold the weights of an odd width and of the next even one
  TORCH_CHECK((k + 1) / 2 == k_rows, "rows of width ", k, " for weights of input width ", 2 * k_rows - 1, " or ",
              2 * k_rows);
  const int64_t total = check_grouped(x, counts, groups, k, at::kBFloat16, bias, n, np);
  at::Tensor y = at::empty({total, n}, x.options());
  if (total == 0) return y;
  static const TileTable<Bf16Fn, Bf16Tile, kBf16Rows, kBf16Vecs> tiles;
  run_groups(reinterpret_cast<const uint16_t*>(x.data_ptr()), k, counts,
             reinterpret_cast<const int32_t*>(packed.data_ptr()), k_rows, np, 16, bias.data_ptr<float>(), n, relu,
             reinterpret_cast<uint16_t*>(y.data_ptr()), tiles.table);
  return y;
}

at::Tensor grouped_linear_avx2(const at::Tensor& x, at::IntArrayRef counts, const at::Tensor& packed,
                               const at::Tensor& bias, int64_t n, bool relu) {
  TORCH_CHECK(has_avx2_fma(), "this CPU has no AVX2 with FMA; use the baddbmm stack");
  TORCH_CHECK(packed.dim() == 3 && packed.scalar_type() == at::kFloat && packed.is_contiguous(),
              "grouped_linear_avx2 wants weights from pack_weights_avx2");
  const int64_t groups = packed.size(0), k = packed.size(1), np = packed.size(2);
  const int64_t total = check_grouped(x, counts, groups, k, at::kFloat, bias, n, np);
  at::Tensor y = at::empty({total, n}, x.options());
  if (total == 0) return y;
  static const TileTable<F32Fn, F32Tile, kF32Rows, kF32Vecs> tiles;
  run_groups(x.data_ptr<float>(), k, counts, packed.data_ptr<float>(), k, np, 8, bias.data_ptr<float>(), n, relu,
             y.data_ptr<float>(), tiles.table);
  return y;
}

}  // namespace

TORCH_LIBRARY(ludus, m) {
  m.def("could_pack() -> bool", &could_pack);
  m.def("pack_weights(Tensor weights) -> Tensor", &pack_weights);
  m.def("grouped_linear(Tensor x, int[] counts, Tensor packed, Tensor bias, int n, bool relu) -> Tensor",
        &grouped_linear);
  m.def("kernel_paths() -> str[]", &kernel_paths);
  m.def("pack_weights_avx512bf16(Tensor weights) -> Tensor", &pack_weights_avx512bf16);
  m.def("grouped_linear_avx512bf16(Tensor x, int[] counts, Tensor packed, Tensor bias, int n, bool relu) -> Tensor",
        &grouped_linear_avx512bf16);
  m.def("pack_weights_avx2(Tensor weights) -> Tensor", &pack_weights_avx2);
  m.def("grouped_linear_avx2(Tensor x, int[] counts, Tensor packed, Tensor bias, int n, bool relu) -> Tensor",
        &grouped_linear_avx2);
}
