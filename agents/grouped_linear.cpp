// Grouped bf16 linear layers for agents.nets.StackedActors: the rows of net g, and only those,
// times net g's weights, for every net in one call, on oneDNN's BRGeMM micro-kernels (AMX tiles)
// that ship inside libtorch (at::native::cpublas).
//
// Why not torch.baddbmm: it pads every net's rows to the largest group (~2x the products at a
// self-play step's PFSP-skewed group sizes), and each of its per-net products re-lays the weights
// out for the tiles (~15 us per 256x256 layer before a row counts, measured). Here the weights
// are packed once, when the stack is built, and each group runs in blocks of kBlockRows rows.
//
// Built on first use by agents/kernels.py (torch.utils.cpp_extension); serial on purpose: the
// runners act with one torch thread each.

#include <ATen/core/Tensor.h>
#include <ATen/native/CPUBlas.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <immintrin.h>

#include <cstdint>
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

// y[i, j] = bf16(act(c[i, j] + bias[j])) for a block of rows, 16 columns at a time: the float ->
// bf16 conversion is the CPU's (round to nearest even; denormals flush to zero), and the ReLU
// keeps a NaN and turns -0 into +0.
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void store_rows(
    const float* c, int64_t rows, int64_t ldc, const float* bias, int64_t n, bool relu, uint16_t* y) {
  const __m512 zero = _mm512_setzero_ps();
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < n; j += 16) {
      const __mmask16 in = n - j >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - j)) - 1);
      __m512 v = _mm512_add_ps(_mm512_maskz_loadu_ps(in, c + i * ldc + j), _mm512_maskz_loadu_ps(in, bias + j));
      if (relu)
        v = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, zero, _CMP_GT_OQ) | _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), v);
      _mm256_mask_storeu_epi16(y + i * n + j, in, reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
    }
  }
}

// y[r] = act(x[r] @ W[g] + b[g]) for the rows r of group g: the groups' rows are contiguous in
// x, in order, counts[g] of them. x [rows, K] bf16; packed from pack_weights; bias [G, N] float32.
at::Tensor grouped_linear(const at::Tensor& x, at::IntArrayRef counts, const at::Tensor& packed,
                          const at::Tensor& bias, int64_t n, bool relu) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16 && x.is_contiguous(),
              "grouped_linear wants contiguous bf16 rows [rows, in], got ", x.sizes(), " ", x.scalar_type());
  TORCH_CHECK(packed.dim() == 4 && packed.scalar_type() == at::kBFloat16 && packed.is_contiguous(),
              "grouped_linear wants weights from pack_weights");
  const int64_t groups = packed.size(0), k = packed.size(2), np = packed.size(1) * kPanel;
  TORCH_CHECK(static_cast<int64_t>(counts.size()) == groups, counts.size(), " row counts for ", groups, " nets");
  TORCH_CHECK(x.size(1) == k, "rows of width ", x.size(1), " for weights of input width ", k);
  TORCH_CHECK(n > 0 && n <= np, "output width ", n, " for weights of padded width ", np);
  TORCH_CHECK(bias.dim() == 2 && bias.size(0) == groups && bias.size(1) == n &&
              bias.scalar_type() == at::kFloat && bias.is_contiguous(), "grouped_linear wants float32 biases [nets, out]");
  int64_t total = 0;
  for (int64_t count : counts) {
    TORCH_CHECK(count >= 0, "a negative row count");
    total += count;
  }
  TORCH_CHECK(total == x.size(0), "row counts sum to ", total, " for ", x.size(0), " rows");
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

}  // namespace

TORCH_LIBRARY(ludus, m) {
  m.def("could_pack() -> bool", &could_pack);
  m.def("pack_weights(Tensor weights) -> Tensor", &pack_weights);
  m.def("grouped_linear(Tensor x, int[] counts, Tensor packed, Tensor bias, int n, bool relu) -> Tensor",
        &grouped_linear);
}
