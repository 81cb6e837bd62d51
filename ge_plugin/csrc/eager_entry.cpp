// The torch ops' eager entry in C++: module attnres_ge.ge_plugin._eager.
//
// Registered in Python, a call of torch.ops.attnres.block_attention_residuals crosses
// from the dispatcher into Python twice (the autograd kernel, then the CPU kernel), and
// the Python entry then plans, allocates and launches: 60-80 us a call on a 2-core host,
// more than a decode step's kernel. install() registers instead, for both ops:
//
//   Autograd (forward op)  a torch::autograd::Function with the backward of
//                          ge_plugin/block_attention_residuals.py
//   CPU                    a cache of launches by input signature (op, dtypes, shapes,
//                          attributes); a cached signature runs here: contiguous inputs,
//                          fresh outputs of the remembered shapes, the native kernel on
//                          the remembered launch record
//
// A signature not cached yet runs the Python entry (ge_plugin/op_common.py), which
// validates, plans (op_host), allocates and launches as it always has, and hands back
// the launch record of the plan when a repeat can run here: the native kernels are the
// active implementation and no output came from the huge-page pool. So every error
// message, and every first call, is the Python entry's; repeats launch the very record
// that call made, on the same kernels, and give the same bits. forget() empties the cache
// (the Python side calls it when the kernel implementation changes).

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/library.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "../../op_kernel/csrc/attnres_native.h"

namespace py = pybind11;

namespace {

constexpr int kForwardOp = 0;   // index of BlockAttentionResiduals on the Python side
constexpr int kBackwardOp = 1;  // BlockAttentionResidualsGrad
constexpr size_t kMaxCachedLaunches = 1024;  // as op_host.runtime.PLAN_CACHE_SIZE

using ForwardResult = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
using BackwardResult = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

struct OutputMeta {
  std::vector<int64_t> sizes;
  at::ScalarType dtype;
};

// What a repeat of one signature needs: the launch record, output shapes and dtypes, workspace bytes.
struct CachedLaunch {
  attnres::ForwardArgs forward{};    // kForwardOp
  attnres::BackwardArgs backward{};  // kBackwardOp
  bool keep_stats = false;           // forward: inv_norm and probs are written
  std::vector<OutputMeta> outputs;
  int64_t workspace_bytes = 0;
};

using Key = std::vector<int64_t>;

struct KeyHash {
  size_t operator()(const Key& key) const {
    size_t hash = 1469598103934665603ull;
    for (int64_t value : key) hash = (hash ^ static_cast<size_t>(value)) * 1099511628211ull;
    return hash;
  }
};

struct EntryState {
  attnres::KernelTable kernels{};
  py::object python_entry;  // op_common._first_call
  std::mutex mutex;
  std::unordered_map<Key, std::shared_ptr<const CachedLaunch>, KeyHash> launches;
  std::vector<std::unique_ptr<torch::Library>> registrations;
};

EntryState& state() {
  static auto* instance = new EntryState();  // never destroyed: the dispatcher may call in at exit
  return *instance;
}

Key signature(int op, std::initializer_list<const at::Tensor*> tensors, std::initializer_list<int64_t> attrs) {
  Key key{op};
  for (const at::Tensor* tensor : tensors) {
    key.push_back(static_cast<int64_t>(tensor->scalar_type()));
    key.push_back(tensor->dim());
    for (int64_t size : tensor->sizes()) key.push_back(size);
  }
  key.insert(key.end(), attrs);
  return key;
}

int64_t bits_of(double value) {
  int64_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

std::shared_ptr<const CachedLaunch> cached(const Key& key) {
  EntryState& entry = state();
  std::lock_guard<std::mutex> lock(entry.mutex);
  auto found = entry.launches.find(key);
  return found == entry.launches.end() ? nullptr : found->second;
}

void remember(const Key& key, std::shared_ptr<const CachedLaunch> launch) {
  EntryState& entry = state();
  std::lock_guard<std::mutex> lock(entry.mutex);
  if (entry.launches.size() >= kMaxCachedLaunches) entry.launches.clear();
  entry.launches.emplace(key, std::move(launch));
}

std::vector<at::Tensor> fresh_outputs(const CachedLaunch& launch) {
  std::vector<at::Tensor> outputs;
  outputs.reserve(launch.outputs.size());
  for (const OutputMeta& meta : launch.outputs) outputs.push_back(at::empty(meta.sizes, at::dtype(meta.dtype)));
  return outputs;
}

// The Python entry for a signature not cached: its outputs; the launch is remembered when it can be repeated here.
std::vector<at::Tensor> first_call(int op, const Key& key, const std::vector<at::Tensor>& inputs, py::dict attrs) {
  py::gil_scoped_acquire gil;
  py::tuple answer = state().python_entry(op, py::cast(inputs), attrs);  // Python errors propagate as they are
  auto outputs = answer[0].cast<std::vector<at::Tensor>>();
  py::object record = answer[1];
  if (record.is_none()) return outputs;
  auto launch = std::make_shared<CachedLaunch>();
  const char* name = op == kForwardOp ? attnres::kForwardRecordCapsule : attnres::kBackwardRecordCapsule;
  void* pointer = PyCapsule_GetPointer(record.ptr(), name);
  if (pointer == nullptr) throw py::error_already_set();
  if (op == kForwardOp) {
    launch->forward = *static_cast<const attnres::ForwardArgs*>(pointer);
    launch->keep_stats = attrs["need_backward"].cast<bool>();
  } else {
    launch->backward = *static_cast<const attnres::BackwardArgs*>(pointer);
  }
  launch->workspace_bytes = answer[2].cast<int64_t>();
  for (const at::Tensor& output : outputs) launch->outputs.push_back({output.sizes().vec(), output.scalar_type()});
  remember(key, std::move(launch));
  return outputs;
}

// ---------------------------------------------------------------------------------------------- CPU kernels

ForwardResult forward_cpu(const at::Tensor& partial_block, const at::Tensor& block_res, const at::Tensor& proj_weight,
                          const at::Tensor& norm_weight, int64_t valid_block_num, double norm_eps,
                          bool need_backward) {
  const Key key = signature(kForwardOp, {&partial_block, &block_res, &proj_weight, &norm_weight},
                            {valid_block_num, bits_of(norm_eps), need_backward});
  const auto launch = cached(key);
  if (launch == nullptr) {
    py::gil_scoped_acquire gil;
    py::dict attrs;
    attrs["valid_block_num"] = valid_block_num;
    attrs["norm_eps"] = norm_eps;
    attrs["need_backward"] = need_backward;
    auto outputs = first_call(kForwardOp, key, {partial_block, block_res, proj_weight, norm_weight}, attrs);
    return {outputs[0], outputs[1], outputs[2]};
  }
  const at::Tensor inputs[] = {partial_block.contiguous(), block_res.contiguous(), proj_weight.contiguous(),
                               norm_weight.contiguous()};
  auto outputs = fresh_outputs(*launch);
  attnres::ForwardArgs args = launch->forward;
  args.partial_block = inputs[0].const_data_ptr();
  args.block_res = inputs[1].const_data_ptr();
  args.proj_weight = inputs[2].const_data_ptr();
  args.norm_weight = inputs[3].const_data_ptr();
  args.hidden_states = outputs[0].mutable_data_ptr();
  args.inv_norm = launch->keep_stats ? outputs[1].mutable_data_ptr<float>() : nullptr;
  args.probs = launch->keep_stats ? outputs[2].mutable_data_ptr<float>() : nullptr;
  if (args.tokens > 0) state().kernels.forward(args);
  return {outputs[0], outputs[1], outputs[2]};
}

BackwardResult backward_cpu(const at::Tensor& partial_block, const at::Tensor& block_res,
                            const at::Tensor& proj_weight, const at::Tensor& norm_weight,
                            const at::Tensor& grad_hidden_states, const at::Tensor& inv_norm, const at::Tensor& probs,
                            int64_t valid_block_num) {
  const Key key = signature(
      kBackwardOp, {&partial_block, &block_res, &proj_weight, &norm_weight, &grad_hidden_states, &inv_norm, &probs},
      {valid_block_num});
  const auto launch = cached(key);
  if (launch == nullptr) {
    py::gil_scoped_acquire gil;
    py::dict attrs;
    attrs["valid_block_num"] = valid_block_num;
    auto outputs = first_call(
        kBackwardOp, key, {partial_block, block_res, proj_weight, norm_weight, grad_hidden_states, inv_norm, probs},
        attrs);
    return {outputs[0], outputs[1], outputs[2], outputs[3]};
  }
  const at::Tensor inputs[] = {partial_block.contiguous(),      block_res.contiguous(), proj_weight.contiguous(),
                               norm_weight.contiguous(),        grad_hidden_states.contiguous(),
                               inv_norm.contiguous(),           probs.contiguous()};
  auto outputs = fresh_outputs(*launch);
  const at::Tensor workspace =
      launch->workspace_bytes > 0 ? at::empty({launch->workspace_bytes}, at::dtype(at::kByte)) : at::Tensor();
  attnres::BackwardArgs args = launch->backward;
  args.partial_block = inputs[0].const_data_ptr();
  args.block_res = inputs[1].const_data_ptr();
  args.proj_weight = inputs[2].const_data_ptr();
  args.norm_weight = inputs[3].const_data_ptr();
  args.grad_hidden_states = inputs[4].const_data_ptr();
  args.inv_norm = inputs[5].const_data_ptr<float>();
  args.probs = inputs[6].const_data_ptr<float>();
  args.grad_partial_block = outputs[0].mutable_data_ptr();
  args.grad_block_res = outputs[1].mutable_data_ptr();
  args.grad_proj_weight = outputs[2].mutable_data_ptr();
  args.grad_norm_weight = outputs[3].mutable_data_ptr();
  args.chunk_rows = workspace.defined() ? static_cast<float*>(workspace.mutable_data_ptr()) : nullptr;
  state().kernels.backward(args);
  return {outputs[0], outputs[1], outputs[2], outputs[3]};
}

// ---------------------------------------------------------------------------------------------- autograd

const auto& forward_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("attnres::block_attention_residuals", "")
                             .typed<ForwardResult(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                  const at::Tensor&, int64_t, double, bool)>();
  return op;
}

const auto& backward_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("attnres::block_attention_residuals_backward", "")
                             .typed<BackwardResult(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                   const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                   const at::Tensor&, int64_t)>();
  return op;
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The forward op's autograd: saves the inputs and the statistics, and runs the backward op
// (ge_plugin/block_attention_residuals.py registers the same in Python when this module is absent).
struct ForwardFunction : public torch::autograd::Function<ForwardFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& partial_block, const at::Tensor& block_res,
                               const at::Tensor& proj_weight, const at::Tensor& norm_weight, int64_t valid_block_num,
                               double norm_eps, bool need_backward) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;  // the CPU (or fake, or NPU) kernel, not this one again
    auto [hidden_states, inv_norm, probs] = forward_op().call(partial_block, block_res, proj_weight, norm_weight,
                                                               valid_block_num, norm_eps, need_backward);
    ctx->mark_non_differentiable({inv_norm, probs});
    ctx->save_for_backward({partial_block, block_res, proj_weight, norm_weight, inv_norm, probs});
    ctx->saved_data["norm_eps"] = norm_eps;
    ctx->saved_data["saved_stats"] = need_backward;
    return {hidden_states, inv_norm, probs};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &partial_block = saved[0], &block_res = saved[1], &proj_weight = saved[2],
                     &norm_weight = saved[3];
    at::Tensor inv_norm = saved[4], probs = saved[5];
    if (!ctx->saved_data["saved_stats"].toBool()) {
      // Called directly with need_backward=false: compute the statistics now rather than fail.
      std::tie(std::ignore, inv_norm, probs) = forward_op().call(
          partial_block, block_res, proj_weight, norm_weight, -1, ctx->saved_data["norm_eps"].toDouble(), true);
    }
    auto [grad_partial, grad_blocks, grad_proj, grad_norm] = backward_op().call(
        partial_block, block_res, proj_weight.reshape({1, -1}), norm_weight, grads[0], inv_norm, probs, 0);
    return {grad_partial, grad_blocks, grad_proj.reshape(proj_weight.sizes()), grad_norm,
            at::Tensor(),  at::Tensor(),  at::Tensor()};
  }
};

ForwardResult forward_autograd(const at::Tensor& partial_block, const at::Tensor& block_res,
                               const at::Tensor& proj_weight, const at::Tensor& norm_weight, int64_t valid_block_num,
                               double norm_eps, bool need_backward) {
  variable_list outputs = ForwardFunction::apply(partial_block, block_res, proj_weight, norm_weight, valid_block_num,
                                                 norm_eps, need_backward);
  return {outputs[0], outputs[1], outputs[2]};
}

// ---------------------------------------------------------------------------------------------- module

// Registers the kernels (once) with `kernel_table` (the _native capsule) and `python_entry`, the Python
// entry for signatures not cached: python_entry(op_index, inputs, attrs) -> (outputs, launch record or
// None, workspace bytes).
void install(py::capsule kernel_table, py::object python_entry) {
  EntryState& entry = state();
  if (!entry.registrations.empty()) throw std::runtime_error("attnres_ge._eager: install() was called already");
  auto* kernels = static_cast<attnres::KernelTable*>(PyCapsule_GetPointer(kernel_table.ptr(),
                                                                          attnres::kKernelTableCapsule));
  if (kernels == nullptr) throw py::error_already_set();
  entry.kernels = *kernels;
  entry.python_entry = std::move(python_entry);
  auto cpu = std::make_unique<torch::Library>(torch::Library::IMPL, "attnres", c10::DispatchKey::CPU, __FILE__,
                                              __LINE__);
  cpu->impl("block_attention_residuals", TORCH_FN(forward_cpu));
  cpu->impl("block_attention_residuals_backward", TORCH_FN(backward_cpu));
  auto autograd = std::make_unique<torch::Library>(torch::Library::IMPL, "attnres", c10::DispatchKey::Autograd,
                                                   __FILE__, __LINE__);
  autograd->impl("block_attention_residuals", TORCH_FN(forward_autograd));
  entry.registrations.push_back(std::move(cpu));
  entry.registrations.push_back(std::move(autograd));
}

void forget() {
  EntryState& entry = state();
  std::lock_guard<std::mutex> lock(entry.mutex);
  entry.launches.clear();
}

size_t cached_launches() {
  EntryState& entry = state();
  std::lock_guard<std::mutex> lock(entry.mutex);
  return entry.launches.size();
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.doc() = "The torch ops' eager entry in C++ (private: installed by attnres_ge.ge_plugin.op_common)";
  module.def("install", &install, py::arg("kernel_table"), py::arg("python_entry"));
  module.def("forget", &forget, "Empty the cache of launches by input signature");
  module.def("cached_launches", &cached_launches, "How many input signatures have a cached launch");
}
