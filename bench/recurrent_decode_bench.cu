// The fused recurrent forward's thread layouts at a decoding step, measured alone (not part of the
// library): GDN (or KDA, second argument 1) at B = 64, H = HV = 16, K = V = 128, float32 state, bf16
// tokens, T tokens (first argument). A is the layout the library used before (a lane per state
// column, 16 rows per thread, 256 threads, four CTAs per SM); B<W, MINB> the one it uses now (lanes
// of four float4 columns and 8 rows, W warps, __launch_bounds__ minimum MINB CTAs per SM). Each
// variant's final state and output are compared with A's; times are the median of 200 calls with a
// 256 MiB memset between calls (CUDA events). "vt": the grid's consecutive CTAs are the V tiles of one
// state instead of the same tile of consecutive states; "plain": B<4, 8> with plain loads and stores of the
// state instead of the streaming (evict-first) __ldcs / __stcs. The library (since a1f3b31) takes "vt" with
// plain loads and stores at one token per sequence and B<4, 8> with the hints otherwise; its own forms
// were measured in the library (bench/results/h100/studies/recurrent-forms-h100.txt), and since stop 57 it loads a
// token's inputs with one 16-byte load per thread, which these variants do not (recurrent-inputs-h100.txt).
// Build and run on the GPU machine:
//   nvcc -O3 -std=c++20 -arch=sm_90a -I. -Iinclude -o /tmp/recurrent_decode bench/recurrent_decode_bench.cu
//   /tmp/recurrent_decode 1 0; /tmp/recurrent_decode 1 1; /tmp/recurrent_decode 16 0
// Results: bench/results/h100/studies/recurrent_decode-h100.txt; with the "plain" rows recurrent_decode-h100-cs.txt.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdio>
#include <vector>
#include <algorithm>
#include <cstdlib>
#include <cmath>
// The library's element loads and stores in any float dtype (ldf, stf, kF32 ...).
#include "src/ops/linear_attention/la_sm80.cuh"
using fusedops::la::sm80::kBF16;
using fusedops::la::sm80::kF32;
using fusedops::la::sm80::ldf;
using fusedops::la::sm80::stf;
struct Args { const void *q, *k, *v, *g, *beta; const float* h0; void* o; float* ht; int cq, cg, T, HV, K, V; float scale; };
// token [B,T,H,D] contiguous: off = ((b*T+t)*H+h)*D+d
// A: replica of the library's layout (lane = column, warp = row group, KR rows per thread)
template <int KR, bool KDA>
__global__ void __launch_bounds__(256, 4) kA(Args a, int H) {
  __shared__ float ks[8 * KR], qs[8 * KR], as[KDA ? 8 * KR : 1], vs[32], red[8][32], gb[2];
  const int K = a.K, V = a.V, HV = a.HV;
  const int64_t n = blockIdx.x / HV; const int hv = blockIdx.x % HV, hk = hv / (HV / H);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, x = blockIdx.y * 32 + lane; const bool xv = x < V;
  const int64_t sidx = n * HV + hv;
  float st[KR];
#pragma unroll
  for (int r = 0; r < KR; ++r) { const int y = warp + 8 * r; st[r] = (a.h0 && xv && y < K) ? ldf(a.h0, kF32, (sidx * K + y) * V + x) : 0.f; }
  for (int t = 0; t < a.T; ++t) {
    __syncthreads();
    for (int e = threadIdx.x; e < K; e += blockDim.x) {
      ks[e] = ldf(a.k, a.cq, ((n * a.T + t) * H + hk) * K + e); qs[e] = ldf(a.q, a.cq, ((n * a.T + t) * H + hk) * K + e);
      if constexpr (KDA) as[e] = expf(ldf(a.g, a.cg, ((n * a.T + t) * HV + hv) * K + e));
    }
    if (threadIdx.x < 32) vs[lane] = xv ? ldf(a.v, a.cq, ((n * a.T + t) * HV + hv) * V + x) : 0.f;
    if (threadIdx.x == 0) { if constexpr (!KDA) gb[0] = expf(ldf(a.g, a.cg, (n * a.T + t) * HV + hv)); gb[1] = ldf(a.beta, a.cg, (n * a.T + t) * HV + hv); }
    __syncthreads();
    float p = 0.f;
#pragma unroll
    for (int r = 0; r < KR; ++r) { const int y = warp + 8 * r; if (y < K) { if constexpr (KDA) st[r] *= as[y]; p = fmaf(st[r], ks[y], p); } }
    red[warp][lane] = p; __syncthreads();
    const float decay = KDA ? 1.f : gb[0]; float ps = 0.f;
#pragma unroll
    for (int w = 0; w < 8; ++w) ps += red[w][lane];
    const float delta = gb[1] * (vs[lane] - decay * ps);
    float po = 0.f;
#pragma unroll
    for (int r = 0; r < KR; ++r) { const int y = warp + 8 * r; if (y < K) { st[r] = KDA ? fmaf(ks[y], delta, st[r]) : fmaf(decay, st[r], ks[y] * delta); po = fmaf(st[r], qs[y], po); } }
    __syncthreads(); red[warp][lane] = po; __syncthreads();
    if (warp == 0 && xv) { float os = 0.f;
#pragma unroll
      for (int w = 0; w < 8; ++w) os += red[w][lane];
      stf(a.o, a.cq, ((n * a.T + t) * HV + hv) * V + x, a.scale * os); }
  }
  if (a.ht && xv) {
#pragma unroll
    for (int r = 0; r < KR; ++r) { const int y = warp + 8 * r; if (y < K) stf(a.ht, kF32, (sidx * K + y) * V + x, st[r]); }
  }
}
// B: float4 columns. W warps; lane = (rs = lane>>3: row in a group of 4, c4 = lane&7: columns 4c4..4c4+3);
// thread rows y_i = 4*warp + rs + 4*W*i, i < R = K/(4W) (K = 128 here: R = 32/W).
template <int W, int MINB, bool KDA, bool VT_FAST = false, bool CS = true>
__global__ void __launch_bounds__(32 * W, MINB) kB(Args a, int H) {
  constexpr int R = 32 / W;  // K = 128
  __shared__ float ks[128], qs[128], as[KDA ? 128 : 1], red[W][32], gb[2];
  __shared__ float4 vs4[8];
  const int K = 128, V = a.V, HV = a.HV;
  // VT_FAST: a 1-D grid whose consecutive CTAs are the V tiles of one state; else (N HV, V / 32).
  const int nvt = V / 32, vt = VT_FAST ? blockIdx.x % nvt : blockIdx.y, nh = VT_FAST ? blockIdx.x / nvt : blockIdx.x;
  const int64_t n = nh / HV; const int hv = nh % HV, hk = hv / (HV / H);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, rs = lane >> 3, c4 = lane & 7;
  const int x = vt * 32 + 4 * c4;  // V % 32 == 0 in this micro
  const int64_t sidx = n * HV + hv;
  const float* hp = a.h0 + (sidx * K + 4 * warp + rs) * V + x;
  float4 st[R];
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const float4* src = reinterpret_cast<const float4*>(hp + static_cast<int64_t>(4 * W * i) * V);
    st[i] = CS ? __ldcs(src) : *src;
  }
  for (int t = 0; t < a.T; ++t) {
    __syncthreads();
    for (int e = threadIdx.x; e < K; e += blockDim.x) {
      ks[e] = ldf(a.k, a.cq, ((n * a.T + t) * H + hk) * K + e); qs[e] = ldf(a.q, a.cq, ((n * a.T + t) * H + hk) * K + e);
      if constexpr (KDA) as[e] = expf(ldf(a.g, a.cg, ((n * a.T + t) * HV + hv) * K + e));
    }
    if (threadIdx.x < 32) reinterpret_cast<float*>(vs4)[lane] = ldf(a.v, a.cq, ((n * a.T + t) * HV + hv) * V + vt * 32 + lane);
    if (threadIdx.x == 0) { if constexpr (!KDA) gb[0] = expf(ldf(a.g, a.cg, (n * a.T + t) * HV + hv)); gb[1] = ldf(a.beta, a.cg, (n * a.T + t) * HV + hv); }
    __syncthreads();
    float4 p = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int i = 0; i < R; ++i) { const int y = 4 * warp + rs + 4 * W * i;
      if constexpr (KDA) { const float s = as[y]; st[i].x *= s; st[i].y *= s; st[i].z *= s; st[i].w *= s; }
      const float kk = ks[y]; p.x = fmaf(st[i].x, kk, p.x); p.y = fmaf(st[i].y, kk, p.y); p.z = fmaf(st[i].z, kk, p.z); p.w = fmaf(st[i].w, kk, p.w); }
#pragma unroll
    for (int m = 8; m < 32; m <<= 1) { p.x += __shfl_xor_sync(~0u, p.x, m); p.y += __shfl_xor_sync(~0u, p.y, m); p.z += __shfl_xor_sync(~0u, p.z, m); p.w += __shfl_xor_sync(~0u, p.w, m); }
    if (rs == 0) reinterpret_cast<float4*>(red[warp])[c4] = p;
    __syncthreads();
    float4 ps = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int w = 0; w < W; ++w) { const float4 r = reinterpret_cast<const float4*>(red[w])[c4]; ps.x += r.x; ps.y += r.y; ps.z += r.z; ps.w += r.w; }
    const float decay = KDA ? 1.f : gb[0], b = gb[1]; const float4 vv = vs4[c4];
    const float4 d = make_float4(b * (vv.x - decay * ps.x), b * (vv.y - decay * ps.y), b * (vv.z - decay * ps.z), b * (vv.w - decay * ps.w));
    float4 po = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int i = 0; i < R; ++i) { const int y = 4 * warp + rs + 4 * W * i; const float kk = ks[y], qq = qs[y];
      if constexpr (KDA) { st[i].x = fmaf(kk, d.x, st[i].x); st[i].y = fmaf(kk, d.y, st[i].y); st[i].z = fmaf(kk, d.z, st[i].z); st[i].w = fmaf(kk, d.w, st[i].w); }
      else { st[i].x = fmaf(decay, st[i].x, kk * d.x); st[i].y = fmaf(decay, st[i].y, kk * d.y); st[i].z = fmaf(decay, st[i].z, kk * d.z); st[i].w = fmaf(decay, st[i].w, kk * d.w); }
      po.x = fmaf(st[i].x, qq, po.x); po.y = fmaf(st[i].y, qq, po.y); po.z = fmaf(st[i].z, qq, po.z); po.w = fmaf(st[i].w, qq, po.w); }
#pragma unroll
    for (int m = 8; m < 32; m <<= 1) { po.x += __shfl_xor_sync(~0u, po.x, m); po.y += __shfl_xor_sync(~0u, po.y, m); po.z += __shfl_xor_sync(~0u, po.z, m); po.w += __shfl_xor_sync(~0u, po.w, m); }
    __syncthreads();
    if (rs == 0) reinterpret_cast<float4*>(red[warp])[c4] = po;
    __syncthreads();
    if (warp == 0) { float os = 0.f;
#pragma unroll
      for (int w = 0; w < W; ++w) os += red[w][lane];
      stf(a.o, a.cq, ((n * a.T + t) * HV + hv) * V + vt * 32 + lane, a.scale * os); }
  }
  float* hq = a.ht + (sidx * K + 4 * warp + rs) * V + x;
#pragma unroll
  for (int i = 0; i < R; ++i) {
    float4* dst = reinterpret_cast<float4*>(hq + static_cast<int64_t>(4 * W * i) * V);
    if (CS) __stcs(dst, st[i]); else *dst = st[i];
  }
}
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s line %d\n", cudaGetErrorString(e), __LINE__); exit(1);} } while (0)
template <class F> float timeit(F f, char* flush, size_t fb, int reps) {
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1); std::vector<float> ts;
  for (int i = 0; i < 10 + reps; ++i) { cudaMemsetAsync(flush, i, fb); cudaEventRecord(e0); f(); cudaEventRecord(e1); cudaEventSynchronize(e1);
    float ms; cudaEventElapsedTime(&ms, e0, e1); if (i >= 10) ts.push_back(ms * 1000.f); }
  std::sort(ts.begin(), ts.end()); return ts[ts.size() / 2];
}
int main(int argc, char** argv) {
  const int B = 64, H = 16, HV = 16, K = 128, V = 128, T = argc > 1 ? atoi(argv[1]) : 1; const bool kda = argc > 2 && atoi(argv[2]);
  const size_t ns = size_t(B) * HV * K * V, nt = size_t(B) * T * H * K, nv = size_t(B) * T * HV * V, ng = size_t(B) * T * HV * (kda ? K : 1);
  float *h0, *ht, *ht2, *g, *beta; __nv_bfloat16 *q, *k, *v, *o, *o2; char* flush; const size_t fb = 256u << 20;
  CK(cudaMalloc(&h0, ns * 4)); CK(cudaMalloc(&ht, ns * 4)); CK(cudaMalloc(&ht2, ns * 4)); CK(cudaMalloc(&g, ng * 4)); CK(cudaMalloc(&beta, size_t(B) * T * HV * 4));
  CK(cudaMalloc(&q, nt * 2)); CK(cudaMalloc(&k, nt * 2)); CK(cudaMalloc(&v, nv * 2)); CK(cudaMalloc(&o, nv * 2)); CK(cudaMalloc(&o2, nv * 2)); CK(cudaMalloc(&flush, fb));
  { std::vector<float> hh(ns); for (size_t i = 0; i < ns; ++i) hh[i] = (rand() / float(RAND_MAX) - 0.5f) * 0.1f; CK(cudaMemcpy(h0, hh.data(), ns * 4, cudaMemcpyHostToDevice));
    std::vector<__nv_bfloat16> tq(std::max(nt, nv)); for (auto& x : tq) x = __float2bfloat16((rand() / float(RAND_MAX) - 0.5f) * 0.2f);
    CK(cudaMemcpy(q, tq.data(), nt * 2, cudaMemcpyHostToDevice)); CK(cudaMemcpy(k, tq.data(), nt * 2, cudaMemcpyHostToDevice)); CK(cudaMemcpy(v, tq.data(), nv * 2, cudaMemcpyHostToDevice));
    std::vector<float> gg(ng); for (auto& x : gg) x = -0.1f * rand() / float(RAND_MAX); CK(cudaMemcpy(g, gg.data(), ng * 4, cudaMemcpyHostToDevice));
    std::vector<float> bb(size_t(B) * T * HV); for (auto& x : bb) x = rand() / float(RAND_MAX); CK(cudaMemcpy(beta, bb.data(), bb.size() * 4, cudaMemcpyHostToDevice)); }
  Args a{q, k, v, g, beta, h0, o, ht, kBF16, kF32, T, HV, K, V, 0.088f};
  Args b2 = a; b2.o = o2; b2.ht = ht2;
  dim3 grid(B * HV, V / 32);
  float cp = timeit([&] { cudaMemcpyAsync(ht2, h0, ns * 4, cudaMemcpyDeviceToDevice); }, flush, fb, 50);
  printf("T=%d kda=%d copy of the state %.1f us (%.2f TB/s)\n", T, kda, cp, 2.0 * ns * 4 / cp / 1e6);
  auto A = [&] { if (kda) kA<16, true><<<grid, 256>>>(a, H); else kA<16, false><<<grid, 256>>>(a, H); };
  auto run = [&](const char* name, auto f) {
    f(); CK(cudaDeviceSynchronize()); A(); CK(cudaDeviceSynchronize());
    std::vector<float> x(ns), y(ns); CK(cudaMemcpy(x.data(), ht, ns * 4, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(y.data(), ht2, ns * 4, cudaMemcpyDeviceToHost));
    double m = 0; for (size_t i = 0; i < ns; ++i) m = std::max(m, (double)fabsf(x[i] - y[i]));
    std::vector<__nv_bfloat16> ox(nv), oy(nv); CK(cudaMemcpy(ox.data(), o, nv * 2, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(oy.data(), o2, nv * 2, cudaMemcpyDeviceToHost));
    double mo = 0; for (size_t i = 0; i < nv; ++i) mo = std::max(mo, (double)fabsf(__bfloat162float(ox[i]) - __bfloat162float(oy[i])));
    float us = timeit(f, flush, fb, 200);
    printf("%-14s %8.1f us  %.2f TB/s  max|dstate| %.2e max|do| %.2e\n", name, us, 2.0 * ns * 4 / us / 1e6, m, mo);
  };
  run("A kr16", [&] { if (kda) kA<16, true><<<grid, 256>>>(b2, H); else kA<16, false><<<grid, 256>>>(b2, H); });
#define RB(W, M) run("B w" #W " m" #M, [&] { if (kda) kB<W, M, true><<<grid, 32 * W>>>(b2, H); else kB<W, M, false><<<grid, 32 * W>>>(b2, H); });
  RB(4, 1) RB(4, 4) RB(4, 6) RB(4, 8) RB(8, 1) RB(8, 3) RB(8, 4) RB(2, 1) RB(2, 8) RB(2, 12)
  const unsigned g1 = B * HV * (V / 32);
  run("B w4 m8 vt", [&] { if (kda) kB<4, 8, true, true><<<g1, 128>>>(b2, H); else kB<4, 8, false, true><<<g1, 128>>>(b2, H); });
  run("B w4 m8 plain", [&] { if (kda) kB<4, 8, true, false, false><<<grid, 128>>>(b2, H); else kB<4, 8, false, false, false><<<grid, 128>>>(b2, H); });
  run("B w8 m4 vt", [&] { if (kda) kB<8, 4, true, true><<<g1, 256>>>(b2, H); else kB<8, 4, false, true><<<g1, 256>>>(b2, H); });
  CK(cudaGetLastError());
  return 0;
}
