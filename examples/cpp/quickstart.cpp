// fusedops from C++: no Python, no framework. Normalises a batch of rows on the CPU (and on the
// first CUDA device when there is one), then runs the backward, and checks one value.
#include <cmath>
#include <cstdio>
#include <vector>

#include "fusedops/fusedops.h"

#ifdef FUSEDOPS_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

int main() {
  using namespace fusedops;
  const int64_t rows = 4, dim = 8;
  std::vector<float> x(rows * dim), y(rows * dim), rstd(rows), dy(rows * dim, 1.0f), dx(rows * dim);
  for (int64_t i = 0; i < rows * dim; ++i) x[i] = 0.25f * static_cast<float>(i % 7) - 0.5f;

  // The caller owns every buffer; TensorView only describes it.
  TensorView xv(x.data(), DType::kFloat32, Device::cpu(), {rows, dim});
  TensorView yv(y.data(), DType::kFloat32, Device::cpu(), {rows, dim});
  TensorView rv(rstd.data(), DType::kFloat32, Device::cpu(), {rows});
  rmsnorm_without_weight_fwd(Context::cpu(), {xv, yv, rv, 1e-6});
  rmsnorm_without_weight_bwd(
      Context::cpu(),
      {xv, rv, TensorView(dy.data(), DType::kFloat32, Device::cpu(), {rows, dim}), TensorView(),
       TensorView(dx.data(), DType::kFloat32, Device::cpu(), {rows, dim})});

  double ss = 0;
  for (int64_t d = 0; d < dim; ++d) ss += double(x[d]) * x[d];
  const double expect = 1.0 / std::sqrt(ss / dim + 1e-6);
  std::printf("rstd[0] = %.6f (expected %.6f), y[0][1] = %.6f, dx[0][0] = %.6f\n", rstd[0], expect,
              y[1], dx[0]);
  std::printf("backends for rmsnorm_without_weight:");
  for (const auto& info : Registry::instance().list("rmsnorm_without_weight"))
    std::printf(" %s/%s%s", info.spec.id.c_str(), direction_name(info.direction),
                info.runnable_here ? "" : "(not here)");
  std::printf("\n");
  bool ok = std::abs(rstd[0] - expect) < 1e-5;

#ifdef FUSEDOPS_WITH_CUDA
  if (cuda_device_count() > 0) {
    void *dxp = nullptr, *dyp = nullptr, *drp = nullptr;
    if (cudaMalloc(&dxp, x.size() * 4) != cudaSuccess || cudaMalloc(&dyp, y.size() * 4) != cudaSuccess ||
        cudaMalloc(&drp, rows * 4) != cudaSuccess)
      return 1;
    cudaMemcpy(dxp, x.data(), x.size() * 4, cudaMemcpyHostToDevice);
    Context ctx = Context::cuda(0);  // the default stream
    l2norm_fwd(ctx, {TensorView(dxp, DType::kFloat32, Device::cuda(0), {rows, dim}),
                     TensorView(dyp, DType::kFloat32, Device::cuda(0), {rows, dim}),
                     TensorView(drp, DType::kFloat32, Device::cuda(0), {rows}), 1e-6});
    std::vector<float> r(rows);
    cudaMemcpy(r.data(), drp, rows * 4, cudaMemcpyDeviceToHost);
    std::printf("cuda l2norm rstd[0] = %.6f (expected %.6f)\n", r[0], 1.0 / std::sqrt(ss + 1e-6));
    ok = ok && std::abs(r[0] - 1.0 / std::sqrt(ss + 1e-6)) < 1e-5;
    cudaFree(dxp);
    cudaFree(dyp);
    cudaFree(drp);
  }
#endif
  return ok ? 0 : 1;
}
