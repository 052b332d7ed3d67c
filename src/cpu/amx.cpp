// The AMX bf16 GEMM of src/cpu/amx.h.
//
// Tiles: Ct blocks of 32 x 32 fp32 in four accumulator tiles (tmm0-3); the A-operand tiles (tmm4-5)
// are 16 rows of B x 32 bf16 of K, loaded straight from B's rows; the B-operand tiles (tmm6-7) are
// Ap's pair layout: tile row kk holds, for each of 16 rows m of A, the pair A[m][2kk], A[m][2kk+1]
// (a 16 x 16 transpose of dwords, done once by pack_pairs). B's rows are copied to a zero-padded
// buffer only where a 32-row group or K's tail would read past them.
#include "src/cpu/amx.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "fusedops/core/error.h"
#include "src/cpu/scratch.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11 && defined(__linux__)
#define FUSEDOPS_AMX 1
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define FUSEDOPS_AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw")))
#endif

namespace fusedops::cpu::amx {

namespace {
std::atomic<bool> g_enabled{true};

#ifdef FUSEDOPS_AMX
bool detect() {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return false;  // OSXSAVE
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool tile = d & (1u << 24), bf16 = d & (1u << 22), avx512bw = b & (1u << 30);
  if (!tile || !bf16 || !avx512bw) return false;
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if ((lo & (3u << 17)) != (3u << 17)) return false;  // XTILECFG and XTILEDATA enabled by the OS
  // Linux hands the 8 KiB tile state to a process only on request (ARCH_REQ_XCOMP_PERM for
  // XFEATURE_XTILEDATA); oneDNN asks the same, and asking twice is harmless.
  constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
}

struct TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// The 16 rows r[0..15] of 16 dwords each -> their transpose, in place (r[kk] = dword kk of every
// row): 32-bit and 64-bit interleaves within 128-bit lanes, then a 4 x 4 transpose of the lanes
// (the all-lanes masked forms: GCC 12's unmasked ones trip -Wmaybe-uninitialized).
FUSEDOPS_AMX_TARGET inline void transpose16(__m512i (&r)[16]) {
  __m512i a[16], b[16];
  for (int i = 0; i < 8; ++i) {
    a[2 * i] = _mm512_maskz_unpacklo_epi32(0xFFFF, r[2 * i], r[2 * i + 1]);
    a[2 * i + 1] = _mm512_maskz_unpackhi_epi32(0xFFFF, r[2 * i], r[2 * i + 1]);
  }
  // b[4i + c], lane j: column 4j + c of rows 4i .. 4i + 3.
  for (int i = 0; i < 4; ++i) {
    b[4 * i + 0] = _mm512_maskz_unpacklo_epi64(0xFF, a[4 * i], a[4 * i + 2]);
    b[4 * i + 1] = _mm512_maskz_unpackhi_epi64(0xFF, a[4 * i], a[4 * i + 2]);
    b[4 * i + 2] = _mm512_maskz_unpacklo_epi64(0xFF, a[4 * i + 1], a[4 * i + 3]);
    b[4 * i + 3] = _mm512_maskz_unpackhi_epi64(0xFF, a[4 * i + 1], a[4 * i + 3]);
  }
  // Column 4j + c: lane i from b[4i + c]'s lane j.
  for (int c = 0; c < 4; ++c) {
    const __m512i p0 = _mm512_maskz_shuffle_i32x4(0xFFFF, b[c], b[4 + c], _MM_SHUFFLE(2, 0, 2, 0));
    const __m512i p1 = _mm512_maskz_shuffle_i32x4(0xFFFF, b[c], b[4 + c], _MM_SHUFFLE(3, 1, 3, 1));
    const __m512i p2 = _mm512_maskz_shuffle_i32x4(0xFFFF, b[8 + c], b[12 + c], _MM_SHUFFLE(2, 0, 2, 0));
    const __m512i p3 = _mm512_maskz_shuffle_i32x4(0xFFFF, b[8 + c], b[12 + c], _MM_SHUFFLE(3, 1, 3, 1));
    r[c] = _mm512_maskz_shuffle_i32x4(0xFFFF, p0, p2, _MM_SHUFFLE(2, 0, 2, 0));
    r[4 + c] = _mm512_maskz_shuffle_i32x4(0xFFFF, p1, p3, _MM_SHUFFLE(2, 0, 2, 0));
    r[8 + c] = _mm512_maskz_shuffle_i32x4(0xFFFF, p0, p2, _MM_SHUFFLE(3, 1, 3, 1));
    r[12 + c] = _mm512_maskz_shuffle_i32x4(0xFFFF, p1, p3, _MM_SHUFFLE(3, 1, 3, 1));
  }
}

FUSEDOPS_AMX_TARGET void pack_pairs_avx512(const bf16_t* A, int64_t lda, int64_t M, int64_t K,
                                           bf16_t* Ap) {
  const int64_t steps = padded_k(K) / 32, groups = padded_rows(M) / 16;
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t ks = 0; ks < steps; ++ks) {
      const int64_t k0 = 32 * ks, kv = std::min<int64_t>(32, K - k0);
      const __mmask32 mask = kv >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((1u << kv) - 1u);
      __m512i r[16];
      for (int n = 0; n < 16; ++n) {
        const int64_t row = 16 * g + n;
        r[n] = row < M ? _mm512_maskz_loadu_epi16(mask, A + row * lda + k0) : _mm512_setzero_si512();
      }
      transpose16(r);
      bf16_t* dst = Ap + (g * steps + ks) * 512;
      for (int kk = 0; kk < 16; ++kk) _mm512_storeu_si512(dst + kk * 32, r[kk]);
    }
}

struct RowScratch {};

FUSEDOPS_AMX_TARGET void gemm_bat_amx(const bf16_t* B, int64_t ldb, int64_t N, const bf16_t* Ap,
                                      int64_t M, int64_t K, float* Ct, int64_t ldc) {
  const int64_t Kp = padded_k(K), steps = Kp / 32, Mp = padded_rows(M);
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
  alignas(64) float stage[32 * 32];
  const int64_t ldc_bytes = ldc * 4;
  for (int64_t n0 = 0; n0 < N; n0 += 32) {
    const int64_t nv = std::min<int64_t>(32, N - n0);
    const bf16_t* src = B + n0 * ldb;
    int64_t ld = ldb;
    if (nv < 32 || K % 32 != 0) {  // a zero-padded copy of the group's rows
      bf16_t* pad = thread_scratch<RowScratch, bf16_t>().get(0, 32 * std::max<int64_t>(Kp, 1));
      for (int64_t i = 0; i < 32; ++i) {
        const int64_t copied = i < nv ? K : 0;
        if (copied) std::memcpy(pad + i * Kp, src + i * ldb, static_cast<size_t>(K) * sizeof(bf16_t));
        std::memset(static_cast<void*>(pad + i * Kp + copied), 0,
                    static_cast<size_t>(Kp - copied) * sizeof(bf16_t));
      }
      src = pad;
      ld = Kp;
    }
    const bf16_t* A0 = src;
    const bf16_t* A1 = src + 16 * ld;
    const int64_t ld_bytes = ld * 2;
    for (int64_t m0 = 0; m0 < Mp; m0 += 32) {
      const bf16_t* B0 = Ap + (m0 / 16) * steps * 512;
      const bf16_t* B1 = B0 + steps * 512;
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t ks = 0; ks < steps; ++ks) {
        _tile_loadd(4, A0 + 32 * ks, ld_bytes);
        _tile_loadd(6, B0 + 512 * ks, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_loadd(7, B1 + 512 * ks, 64);
        _tile_dpbf16ps(1, 4, 7);
        _tile_loadd(5, A1 + 32 * ks, ld_bytes);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
      const int64_t mv = std::min<int64_t>(32, M - m0);
      if (mv == 32 && nv == 32) {
        float* c = Ct + n0 * ldc + m0;
        _tile_stored(0, c, ldc_bytes);
        _tile_stored(1, c + 16, ldc_bytes);
        _tile_stored(2, c + 16 * ldc, ldc_bytes);
        _tile_stored(3, c + 16 * ldc + 16, ldc_bytes);
      } else {
        _tile_stored(0, stage, 128);
        _tile_stored(1, stage + 16, 128);
        _tile_stored(2, stage + 16 * 32, 128);
        _tile_stored(3, stage + 16 * 32 + 16, 128);
        for (int64_t i = 0; i < nv; ++i)
          std::memcpy(Ct + (n0 + i) * ldc + m0, stage + i * 32, static_cast<size_t>(mv) * sizeof(float));
      }
    }
  }
  _tile_release();
}
#endif
}  // namespace

bool available() {
#ifdef FUSEDOPS_AMX
  static const bool detected = detect();
  return detected && g_enabled.load(std::memory_order_relaxed);
#else
  return false;
#endif
}

void set_enabled(bool on) { g_enabled.store(on, std::memory_order_relaxed); }

void pack_pairs(const bf16_t* A, int64_t lda, int64_t M, int64_t K, bf16_t* Ap) {
#ifdef FUSEDOPS_AMX
  FUSEDOPS_REQUIRE(available(), kRuntime, "amx::pack_pairs", "called where AMX is not available");
  pack_pairs_avx512(A, lda, M, K, Ap);
#else
  (void)A, (void)lda, (void)M, (void)K, (void)Ap;
  FUSEDOPS_FAIL(kRuntime, "amx::pack_pairs", "built without AMX support");
#endif
}

void gemm_bat(const bf16_t* B, int64_t ldb, int64_t N, const bf16_t* Ap, int64_t M, int64_t K,
              float* Ct, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
#ifdef FUSEDOPS_AMX
  FUSEDOPS_REQUIRE(available(), kRuntime, "amx::gemm_bat", "called where AMX is not available");
  gemm_bat_amx(B, ldb, N, Ap, M, K, Ct, ldc);
#else
  (void)B, (void)ldb, (void)Ap, (void)K, (void)Ct, (void)ldc;
  FUSEDOPS_FAIL(kRuntime, "amx::gemm_bat", "built without AMX support");
#endif
}

}  // namespace fusedops::cpu::amx
