// The installed library's oneDNN dependency, through a separate project: matmul_add on the CPU
// (oneDNN's GEMM) against a plain loop in double. Exit status 0 when they agree.
#include <cmath>
#include <cstdio>
#include <vector>

#include "fusedops/fusedops.h"

int main() {
  using namespace fusedops;
  const int64_t tokens = 48, out = 24, in = 40;
  std::vector<float> g(tokens * out), x(tokens * in), acc(out * in);
  for (int64_t i = 0; i < tokens * out; ++i) g[i] = 0.01f * static_cast<float>((i * 7) % 23) - 0.1f;
  for (int64_t i = 0; i < tokens * in; ++i) x[i] = 0.02f * static_cast<float>((i * 5) % 19) - 0.15f;
  for (int64_t i = 0; i < out * in; ++i) acc[i] = 0.5f;
  std::vector<double> want(acc.begin(), acc.end());
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i) want[o * in + i] += double(g[t * out + o]) * x[t * in + i];
  matmul_add_fwd(Context::cpu(), {TensorView(g.data(), DType::kFloat32, Device::cpu(), {tokens, out}),
                                  TensorView(x.data(), DType::kFloat32, Device::cpu(), {tokens, in}),
                                  TensorView(acc.data(), DType::kFloat32, Device::cpu(), {out, in}),
                                  TensorView()});
  double err = 0;
  for (int64_t i = 0; i < out * in; ++i) err = std::fmax(err, std::fabs(acc[i] - want[i]));
  std::printf("matmul_add through the installed package: max |error| %.3g\n", err);
  return err < 1e-5 ? 0 : 1;
}
