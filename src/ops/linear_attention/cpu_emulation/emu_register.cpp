// Registers the emulated CUDA kernels of both linear-attention families (cuda_sm80 and cuda_sm90,
// GDN and KDA) and an l2norm alias forwarding to cpu, as CPU backends of those names. Test aid
// only (see build.sh).
#include <climits>

#include "fusedops/core/registry.h"
#include "fusedops/ops/l2norm.h"
namespace fusedops {
void register_linear_attention_cuda_sm80(Registry& r);
void register_gated_delta_rule_cuda_sm80(Registry& r);
void register_gated_delta_rule_cuda_sm90(Registry& r);
void register_kda_cuda_sm80(Registry& r);
void register_kda_cuda_sm90(Registry& r);
}  // namespace fusedops
using namespace fusedops;
namespace {
void l2f(const Context& c, const L2NormFwdArgs& a) {
  Context d = c;
  d.backend = "cpu";
  l2norm_fwd(d, a);
}
void l2b(const Context& c, const L2NormBwdArgs& a) {
  Context d = c;
  d.backend = "cpu";
  l2norm_bwd(d, a);
}
struct Init {
  Init() {
    Registry& r = Registry::instance();
    register_linear_attention_cuda_sm80(r);
    register_gated_delta_rule_cuda_sm80(r);
    register_gated_delta_rule_cuda_sm90(r);
    register_kda_cuda_sm80(r);
    register_kda_cuda_sm90(r);
    BackendSpec s{"cuda_sm80", DeviceKind::kCPU, 0, INT_MAX,
                  {DType::kFloat32, DType::kBFloat16, DType::kFloat16}, 20};
    r.add<L2NormFwdArgs>("l2norm", Direction::kForward, s, nullptr, l2f);
    r.add<L2NormBwdArgs>("l2norm", Direction::kBackward, s, nullptr, l2b);
  }
} init;
}  // namespace
