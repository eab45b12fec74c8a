// w4a16_moe_C: the torch op library that launches prebuilt / JIT-built CuTe kernels on torch's current
// CUDA stream, with no Python C-API code, so that one build serves every Python 3 and every torch >= 2.10.
//
// Built against torch's *stable* ABI (torch/csrc/stable, STABLE_TORCH_LIBRARY, TORCH_BOX) with
// -DTORCH_TARGET_VERSION=0x020a000000000000 (torch 2.10) and linked against libtorch_cpu only; the current
// CUDA stream comes from aoti_torch_get_current_cuda_stream, looked up at run time in the already loaded
// libtorch_cuda.so (dlopen RTLD_NOLOAD + dlsym), since a CPU-only build machine has no libtorch_cuda to link.
// Load it with torch.ops.load_library(path) (python/w4a16_moe/loader/torch_op.py does).
//
// Op (schema below): w4a16_moe_C::grouped_gemm calls the C entry of one grouped-GEMM kernel of a kernel
// library (python/w4a16_moe/loader/build.py, "Exported C ABI"):
//
//   int32_t P_launch(P_Kernel_Module_t *module, void *w, void *act, void *out, void *sorted_routes,
//                    void *route_start, void *block_start, void *topk_weights, void *ws, void *counters,
//                    int32_t num_experts, int32_t n, int32_t k, int32_t num_routes, int32_t top_k,
//                    int32_t max_tiles, int32_t num_splits, cudaStream_t stream);   // returns cudaError_t
//
// launch_fn is the address of P_launch, module the address of its loaded P_Kernel_Module_t (Python:
// Kernel.launch_address / Kernel.module_address). The op checks that every tensor is a CUDA tensor on
// one device and that every size fits int32, then launches on that device's current stream; a non-zero
// cudaError_t raises an error naming it (the name comes from the kernel library that holds launch_fn).

#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>

#include <dlfcn.h>

#include <cstdint>
#include <limits>
#include <mutex>
#include <string>

namespace {

using torch::stable::Tensor;

using LaunchFn = int32_t (*)(void *module, void *w, void *act, void *out, void *sorted_routes, void *route_start,
                             void *block_start, void *topk_weights, void *ws, void *counters, int32_t num_experts,
                             int32_t n, int32_t k, int32_t num_routes, int32_t top_k, int32_t max_tiles,
                             int32_t num_splits, void *stream);
using GetStreamFn = int32_t (*)(int32_t device_index, void **ret_stream);  // AOTITorchError, 0 = success
using ErrorNameFn = const char *(*)(int32_t err);

GetStreamFn current_stream_fn() {
  static GetStreamFn fn = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    // torch has loaded libtorch_cuda.so (RTLD_GLOBAL or not) before any CUDA tensor exists; NOLOAD finds it
    // without loading anything new.
    void *h = dlopen("libtorch_cuda.so", RTLD_NOLOAD | RTLD_LAZY);
    if (h != nullptr) {
      fn = reinterpret_cast<GetStreamFn>(dlsym(h, "aoti_torch_get_current_cuda_stream"));
    }
    if (fn == nullptr) {
      fn = reinterpret_cast<GetStreamFn>(dlsym(RTLD_DEFAULT, "aoti_torch_get_current_cuda_stream"));
    }
  });
  return fn;
}

// "cudaErrorInvalidValue" etc., from the kernel library that contains `launch_fn` (it exports
// w4a16_moe_cuda_error_name); the bare number when that library cannot be found.
std::string cuda_error_name(void *launch_fn, int32_t err) {
  std::string name = "cudaError_t " + std::to_string(err);
  Dl_info info{};
  if (dladdr(launch_fn, &info) == 0 || info.dli_fname == nullptr) return name;
  void *h = dlopen(info.dli_fname, RTLD_NOLOAD | RTLD_LAZY);
  if (h == nullptr) return name;
  auto fn = reinterpret_cast<ErrorNameFn>(dlsym(h, "w4a16_moe_cuda_error_name"));
  if (fn != nullptr) {
    const char *s = fn(err);
    if (s != nullptr) name = std::string(s) + " (" + std::to_string(err) + ")";
  }
  dlclose(h);
  return name;
}

int32_t as_i32(int64_t v, const char *arg) {
  STD_TORCH_CHECK(v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max(),
                  "w4a16_moe_C::grouped_gemm: argument ", arg, " = ", v, " does not fit the kernel's int32_t");
  return static_cast<int32_t>(v);
}

void check_cuda(const Tensor &t, const char *arg, int32_t device) {
  STD_TORCH_CHECK(t.is_cuda(), "w4a16_moe_C::grouped_gemm: tensor argument ", arg, " must be a CUDA tensor");
  STD_TORCH_CHECK(t.get_device_index() == device, "w4a16_moe_C::grouped_gemm: tensor argument ", arg,
                  " is on cuda:", t.get_device_index(), " but act is on cuda:", device);
}

void grouped_gemm(int64_t launch_fn, int64_t module, Tensor w, Tensor act, Tensor out, Tensor sorted_routes,
                  Tensor route_start, Tensor block_start, Tensor topk_weights, Tensor ws, Tensor counters,
                  int64_t num_experts, int64_t n, int64_t k, int64_t num_routes, int64_t top_k, int64_t max_tiles,
                  int64_t num_splits) {
  STD_TORCH_CHECK(launch_fn != 0, "w4a16_moe_C::grouped_gemm: launch_fn is NULL (pass Kernel.launch_address)");
  STD_TORCH_CHECK(module != 0, "w4a16_moe_C::grouped_gemm: module is NULL (pass Kernel.module_address)");
  STD_TORCH_CHECK(act.is_cuda(), "w4a16_moe_C::grouped_gemm: tensor argument act must be a CUDA tensor");
  const int32_t device = act.get_device_index();
  check_cuda(w, "w", device);
  check_cuda(out, "out", device);
  check_cuda(sorted_routes, "sorted_routes", device);
  check_cuda(route_start, "route_start", device);
  check_cuda(block_start, "block_start", device);
  check_cuda(topk_weights, "topk_weights", device);
  check_cuda(ws, "ws", device);
  check_cuda(counters, "counters", device);
  const int32_t e = as_i32(num_experts, "num_experts"), n32 = as_i32(n, "n"), k32 = as_i32(k, "k"),
                r = as_i32(num_routes, "num_routes"), tk = as_i32(top_k, "top_k"),
                mt = as_i32(max_tiles, "max_tiles"), sp = as_i32(num_splits, "num_splits");

  GetStreamFn get_stream = current_stream_fn();
  STD_TORCH_CHECK(get_stream != nullptr,
                  "w4a16_moe_C::grouped_gemm: aoti_torch_get_current_cuda_stream not found "
                  "(is this a CUDA build of torch, with libtorch_cuda.so loaded?)");
  torch::stable::accelerator::DeviceGuard guard(device);
  void *stream = nullptr;
  STD_TORCH_CHECK(get_stream(device, &stream) == 0,
                  "w4a16_moe_C::grouped_gemm: aoti_torch_get_current_cuda_stream failed for cuda:", device);

  void *fn_ptr = reinterpret_cast<void *>(static_cast<intptr_t>(launch_fn));
  auto fn = reinterpret_cast<LaunchFn>(fn_ptr);
  const int32_t err = fn(reinterpret_cast<void *>(static_cast<intptr_t>(module)), w.data_ptr(), act.data_ptr(),
                         out.data_ptr(), sorted_routes.data_ptr(), route_start.data_ptr(), block_start.data_ptr(),
                         topk_weights.data_ptr(), ws.data_ptr(), counters.data_ptr(), e, n32, k32, r, tk, mt, sp,
                         stream);
  STD_TORCH_CHECK(err == 0, "w4a16_moe_C::grouped_gemm: kernel launch failed: ", cuda_error_name(fn_ptr, err));
}

}  // namespace

STABLE_TORCH_LIBRARY(w4a16_moe_C, m) {
  m.def(
      "grouped_gemm(int launch_fn, int module, Tensor w, Tensor act, Tensor(a!) out, Tensor sorted_routes, "
      "Tensor route_start, Tensor block_start, Tensor topk_weights, Tensor(b!) ws, Tensor(c!) counters, "
      "int num_experts, int n, int k, int num_routes, int top_k, int max_tiles, int num_splits) -> ()");
}

STABLE_TORCH_LIBRARY_IMPL(w4a16_moe_C, CUDA, m) { m.impl("grouped_gemm", TORCH_BOX(&grouped_gemm)); }
