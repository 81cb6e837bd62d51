// The Autograd kernels of the two Block AttnRes ops, in C++ (module attnres_ge.ge_plugin._cpp_entry, which
// includes this file inside its anonymous namespace): the ops' own derivative formulas, so that an
// ordinary forward and backward never enter Python.
//
//   forward   a torch::autograd::Function (the ForwardFunction of ge_plugin/block_attention_residuals.py
//             in C++): saves the inputs and the statistics; the gradient of hidden_states runs the
//             backward op, gradients that reach inv_norm or probs the Python statistics_backward
//   backward  the kernel itself unless a graph is needed (create_graph), then the Python
//             BackwardFunction (ge_plugin/block_attention_residuals_grad.py)
//
// An op without such a file gets its autograd from its Python torch op module.

#pragma once

using ForwardResult = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
using BackwardResult = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

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

// The Python functions the Autograd kernels call for the rare derivatives (set_autograd_formulas).
struct AutogradFormulas {
  py::object statistics_backward;      // block_attention_residuals.statistics_backward
  py::object differentiable_backward;  // block_attention_residuals_grad.differentiable_backward
  std::unique_ptr<torch::Library> registration;
};

AutogradFormulas& autograd_formulas() {
  static auto* instance = new AutogradFormulas();  // never destroyed: the dispatcher may call in at exit
  return *instance;
}

const py::object& autograd_formula(py::object AutogradFormulas::*formula) {
  const py::object& function = autograd_formulas().*formula;
  if (!function) throw std::runtime_error("attnres_ge._cpp_entry: set_autograd_formulas() was not called");
  return function;
}

// `tensor`, or None for an undefined one.
py::object tensor_or_none(const at::Tensor& tensor) { return tensor.defined() ? py::cast(tensor) : py::none(); }

at::Tensor add_gradients(const at::Tensor& first, const at::Tensor& second) {
  if (!first.defined()) return second;
  return second.defined() ? at::add(first, second) : first;
}

// The forward op's autograd: saves the inputs and the statistics; the gradient of hidden_states
// runs the backward op, gradients that reach inv_norm or probs the Python statistics_backward
// (ge_plugin/block_attention_residuals.py's ForwardFunction, which runs where this one cannot).
struct ForwardFunction : public torch::autograd::Function<ForwardFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& partial_block, const at::Tensor& block_res,
                               const at::Tensor& proj_weight, const at::Tensor& norm_weight, int64_t valid_block_num,
                               double norm_eps, bool need_backward) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;  // the CPU (or fake, or NPU) kernel, not this one again
    auto [hidden_states, inv_norm, probs] = forward_op().call(partial_block, block_res, proj_weight, norm_weight,
                                                               valid_block_num, norm_eps, need_backward);
    if (!need_backward) ctx->mark_non_differentiable({inv_norm, probs});  // empty statistics
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({partial_block, block_res, proj_weight, norm_weight, inv_norm, probs});
    ctx->saved_data["norm_eps"] = norm_eps;
    ctx->saved_data["saved_stats"] = need_backward;
    return {hidden_states, inv_norm, probs};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &partial_block = saved[0], &block_res = saved[1], &proj_weight = saved[2],
                     &norm_weight = saved[3];
    const double norm_eps = ctx->saved_data["norm_eps"].toDouble();
    variable_list result(7);
    if (grads[0].defined()) {
      at::Tensor inv_norm = saved[4], probs = saved[5];
      if (!ctx->saved_data["saved_stats"].toBool()) {
        // Called directly with need_backward=false: compute the statistics now rather than fail.
        std::tie(std::ignore, inv_norm, probs) =
            forward_op().call(partial_block, block_res, proj_weight, norm_weight, -1, norm_eps, true);
      }
      auto [grad_partial, grad_blocks, grad_proj, grad_norm] = backward_op().call(
          partial_block, block_res, proj_weight.reshape({1, -1}), norm_weight, grads[0], inv_norm, probs, 0);
      result = {grad_partial, grad_blocks, grad_proj.reshape(proj_weight.sizes()), grad_norm,
                at::Tensor(), at::Tensor(), at::Tensor()};
    }
    if (grads[1].defined() || grads[2].defined()) {
      py::gil_scoped_acquire gil;
      auto extra = autograd_formula(&AutogradFormulas::statistics_backward)(
                       partial_block, block_res, proj_weight, norm_weight, norm_eps, tensor_or_none(grads[1]),
                       tensor_or_none(grads[2]))
                       .cast<py::tuple>();
      for (size_t index = 0; index < 4; ++index) {
        if (!extra[index].is_none()) result[index] = add_gradients(result[index], extra[index].cast<at::Tensor>());
      }
    }
    return result;
  }
};

ForwardResult forward_autograd(const at::Tensor& partial_block, const at::Tensor& block_res,
                               const at::Tensor& proj_weight, const at::Tensor& norm_weight, int64_t valid_block_num,
                               double norm_eps, bool need_backward) {
  if (!partial_block.defined() || !block_res.defined() || !proj_weight.defined() || !norm_weight.defined()) {
    // A None input: nothing to differentiate; the CPU entry's validation names it.
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return forward_op().call(partial_block, block_res, proj_weight, norm_weight, valid_block_num, norm_eps,
                             need_backward);
  }
  variable_list outputs = ForwardFunction::apply(partial_block, block_res, proj_weight, norm_weight, valid_block_num,
                                                 norm_eps, need_backward);
  return {outputs[0], outputs[1], outputs[2]};
}

// The backward op's autograd: the kernel when no graph is needed (every first-order backward), else the
// Python BackwardFunction, whose own backward differentiates the backward's formula.
BackwardResult backward_autograd(const at::Tensor& partial_block, const at::Tensor& block_res,
                                 const at::Tensor& proj_weight, const at::Tensor& norm_weight,
                                 const at::Tensor& grad_hidden_states, const at::Tensor& inv_norm,
                                 const at::Tensor& probs, int64_t valid_block_num) {
  const std::vector<at::Tensor> inputs{partial_block, block_res, proj_weight, norm_weight,
                                       grad_hidden_states, inv_norm, probs};
  const bool needs_graph = at::GradMode::is_enabled() &&
      std::any_of(inputs.begin(), inputs.end(), [](const at::Tensor& t) { return t.defined() && t.requires_grad(); });
  if (!needs_graph) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return backward_op().call(partial_block, block_res, proj_weight, norm_weight, grad_hidden_states, inv_norm,
                              probs, valid_block_num);
  }
  py::gil_scoped_acquire gil;
  auto outputs = autograd_formula(&AutogradFormulas::differentiable_backward)(
                     partial_block, block_res, proj_weight, norm_weight, grad_hidden_states, inv_norm, probs,
                     valid_block_num)
                     .cast<py::tuple>();
  return {outputs[0].cast<at::Tensor>(), outputs[1].cast<at::Tensor>(), outputs[2].cast<at::Tensor>(),
          outputs[3].cast<at::Tensor>()};
}

// Registers the Autograd kernels of both Block AttnRes ops (their formulas are the ops' own).
void register_autograd() {
  auto autograd = std::make_unique<torch::Library>(torch::Library::IMPL, "attnres", c10::DispatchKey::Autograd,
                                                   __FILE__, __LINE__);
  autograd->impl("block_attention_residuals", TORCH_FN(forward_autograd));
  autograd->impl("block_attention_residuals_backward", TORCH_FN(backward_autograd));
  autograd_formulas().registration = std::move(autograd);
}

// The Python functions the Autograd kernels call for the rare derivatives: statistics_backward(partial_block,
// block_res, proj_weight, norm_weight, norm_eps, grad_inv_norm or None, grad_probs or None) -> four gradients or
// None; differentiable_backward(seven tensors, valid_block_num) -> the backward op's four outputs, with a graph.
void set_autograd_formulas(py::object statistics_backward, py::object differentiable_backward) {
  AutogradFormulas& formulas = autograd_formulas();
  formulas.statistics_backward = std::move(statistics_backward);
  formulas.differentiable_backward = std::move(differentiable_backward);
}
