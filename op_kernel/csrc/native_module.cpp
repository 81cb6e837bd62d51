// Python bindings of the native kernels: module attnres_ge.op_kernel._native.
//
// Plain Python C API, no torch or pybind11 headers: those would take a minute of
// the install's build time for what is a handful of integers per call.
//
//   record_layouts                    each op's tiling record struct: bytes, fields' offsets
//   make_launch                       an op's tiling record (to_bytes()) -> a launch record
//                                     (capsule, launch_record.h), once the record deals out
//                                     exactly its items and tiles exactly the hidden size
//   launch                            a launch record, data addresses, the thread limit -> the kernel
//   read_forward, read_backward       BlockAttnResRead's kernels, called with their arguments (it has no
//                                     tiling record: block_attn_res_read_args.h)
//   update_norm                       BlockAttnResUpdateNorm's kernel: a BlockAttnResUpdate launch record's,
//                                     with an output RMSNorm of h
//   LANES, DTYPE_CODES                constants the Python side asserts it shares
//   isa_path, available_isa_paths,    the instruction set the kernels run on (dispatch.h)
//   known_isa_paths, select_isa_path
//   last_call_threads                 threads the calling thread's latest kernel call used
//   torch_team_calls,                 how many kernel calls ran on torch's OpenMP team,
//   openmp_team_min_bytes,            the size that makes a call long enough to, and the switch
//   openmp_team_may_be_inherited      that keeps a forked child off it (openmp_team.h)
//
// The kernels walk the record, so they stay inside buffers of the record's sizes;
// that the pointers are such buffers is the caller's to guarantee: the Python
// wrappers (op_kernel/native.py) check every tensor, the host runtime's plans
// guarantee it by construction. It is private: call it only through the wrappers.

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "dispatch.h"
#include "native_ops.h"
#include "openmp_team.h"
#include "thread_pool.h"

namespace {

bool dtype_from_code(int code, attnres::DType* dtype) {
  if (code < 0 || code > 2) {
    PyErr_Format(PyExc_ValueError, "attnres native kernel: unknown dtype code %d", code);
    return false;
  }
  *dtype = static_cast<attnres::DType>(code);
  return true;
}

const attnres::NativeOp* find_op(const char* op_type) {
  for (const attnres::NativeOp& op : attnres::native_ops()) {
    if (std::strcmp(op.op_type, op_type) == 0) return &op;
  }
  PyErr_Format(PyExc_ValueError, "attnres native kernel: no native op %s", op_type);
  return nullptr;
}

void free_launch(PyObject* capsule) {
  delete static_cast<attnres::LaunchRecord*>(PyCapsule_GetPointer(capsule, attnres::kLaunchRecordCapsule));
}

// record_layouts() -> {op type: (record bytes, ((field, offset, size), ...))} for every op.
PyObject* record_layouts(PyObject*, PyObject*) {
  PyObject* layouts = PyDict_New();
  if (layouts == nullptr) return nullptr;
  for (const attnres::NativeOp& op : attnres::native_ops()) {
    PyObject* fields = PyTuple_New(static_cast<Py_ssize_t>(op.fields.size()));
    if (fields == nullptr) return Py_DECREF(layouts), nullptr;
    for (size_t i = 0; i < op.fields.size(); ++i) {
      const attnres::RecordField& field = op.fields[i];
      PyTuple_SET_ITEM(fields, static_cast<Py_ssize_t>(i), Py_BuildValue("(snn)", field.name, field.offset, field.size));
    }
    PyObject* layout = Py_BuildValue("(nN)", static_cast<Py_ssize_t>(op.record_bytes), fields);
    if (layout == nullptr || PyDict_SetItemString(layouts, op.op_type, layout) < 0) {
      Py_XDECREF(layout);
      Py_DECREF(layouts);
      return nullptr;
    }
    Py_DECREF(layout);
  }
  return layouts;
}

// make_launch(op_type, dtype_code, record, stream_min_bytes) -> a launch record (capsule
// kLaunchRecordCapsule) from a tiling record's to_bytes(), once it deals out its items and tiles H exactly.
PyObject* make_launch(PyObject*, PyObject* args) {
  const char* op_type;
  int dtype_code;
  Py_buffer record;
  long long stream_min_bytes;
  if (!PyArg_ParseTuple(args, "siy*L", &op_type, &dtype_code, &record, &stream_min_bytes)) return nullptr;
  const attnres::NativeOp* op = find_op(op_type);
  attnres::DType dtype;
  std::unique_ptr<attnres::LaunchRecord> launch;
  std::string problem;
  if (op != nullptr && dtype_from_code(dtype_code, &dtype)) {
    if (static_cast<size_t>(record.len) != op->record_bytes) {
      PyErr_Format(PyExc_ValueError, "%s native kernel: a tiling record has %zu bytes, got %zd", op_type,
                   op->record_bytes, record.len);
    } else {
      launch = op->make_launch(record.buf, dtype, stream_min_bytes, &problem);
      if (launch == nullptr) PyErr_Format(PyExc_ValueError, "%s native kernel: %s", op_type, problem.c_str());
    }
  }
  PyBuffer_Release(&record);
  if (launch == nullptr) return nullptr;
  PyObject* capsule = PyCapsule_New(launch.get(), attnres::kLaunchRecordCapsule, free_launch);
  if (capsule != nullptr) launch.release();
  return capsule;
}

// The addresses in a sequence of ints (0 for a null pointer), or false with a Python error set.
bool addresses(PyObject* sequence, const char* what, std::vector<void*>* out) {
  PyObject* items = PySequence_Fast(sequence, what);
  if (items == nullptr) return false;
  const Py_ssize_t count = PySequence_Fast_GET_SIZE(items);
  for (Py_ssize_t i = 0; i < count; ++i) {
    void* address = PyLong_AsVoidPtr(PySequence_Fast_GET_ITEM(items, i));
    if (address == nullptr && PyErr_Occurred()) return Py_DECREF(items), false;
    out->push_back(address);
  }
  Py_DECREF(items);
  return true;
}

// launch(record, inputs, outputs, workspace, max_threads): the record's kernel on data addresses
// (prototype order; 0 for an empty output and for no workspace).
PyObject* launch(PyObject*, PyObject* args) {
  PyObject *record, *inputs, *outputs, *workspace;
  int max_threads;
  if (!PyArg_ParseTuple(args, "OOOOi", &record, &inputs, &outputs, &workspace, &max_threads)) return nullptr;
  auto* launch = static_cast<const attnres::LaunchRecord*>(PyCapsule_GetPointer(record, attnres::kLaunchRecordCapsule));
  if (launch == nullptr) return nullptr;
  std::vector<void*> input_addresses, output_addresses;
  if (!addresses(inputs, "inputs must be a sequence of addresses", &input_addresses) ||
      !addresses(outputs, "outputs must be a sequence of addresses", &output_addresses)) {
    return nullptr;
  }
  void* workspace_address = PyLong_AsVoidPtr(workspace);
  if (workspace_address == nullptr && PyErr_Occurred()) return nullptr;
  Py_BEGIN_ALLOW_THREADS launch->run(input_addresses.data(), output_addresses.data(), workspace_address, max_threads);
  Py_END_ALLOW_THREADS
  Py_RETURN_NONE;
}

// The ints of a sequence, or false with a Python error set.
bool integers(PyObject* sequence, const char* what, std::vector<int64_t>* out) {
  PyObject* items = PySequence_Fast(sequence, what);
  if (items == nullptr) return false;
  const Py_ssize_t count = PySequence_Fast_GET_SIZE(items);
  for (Py_ssize_t i = 0; i < count; ++i) {
    const long long value = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(items, i));
    if (value == -1 && PyErr_Occurred()) return Py_DECREF(items), false;
    out->push_back(value);
  }
  Py_DECREF(items);
  return true;
}

// What the read's two bindings share: the sizes, the sources and the attributes, parsed and checked
// against each other (the tensors themselves are op_kernel/native.py's to check).
struct ReadCall {
  attnres::ReadShape shape{};
  std::vector<void*> sources, tensors, grad_sources;
  std::vector<int64_t> strides;
  int max_threads = 1;
  long long stream_min_bytes = 0;  // the forward's only

  // "" when the parsed sizes, lists and dtype agree, else what is wrong.
  std::string problem(size_t tensor_count, bool backward) const {
    const attnres::ReadShape& s = shape;
    if (s.tokens < 0 || s.hidden < 1 || s.rows < 1 || s.queries < 1) return "bad sizes";
    if (s.weight_rows != 0 && s.weight_rows != 1 && s.weight_rows != s.queries) return "W must be 0, 1 or S";
    if (sources.size() != static_cast<size_t>(s.rows) || strides.size() != sources.size()) {
      return "one source address and one row stride per source";
    }
    for (int64_t stride : strides) {
      if (stride < s.hidden) return "a source's row stride is below H";
    }
    if (tensors.size() != tensor_count) return "wrong number of tensor addresses";
    if (backward && grad_sources.size() != sources.size()) return "one gradient per source";
    return "";
  }
};

// Parses (dtype_code, (T, H, L, S, W), sources, source_strides, tensors, [grad_sources,] (eps, output_eps,
// scale), normalize_values, max_threads[, stream_min_bytes: the forward]) into `call`; false with a Python
// error set.
bool parse_read_call(PyObject* args, bool backward, size_t tensor_count, ReadCall* call) {
  int dtype_code, normalize_values;
  PyObject *sources, *strides, *tensors, *grad_sources = nullptr;
  attnres::ReadShape& s = call->shape;
  const bool parsed =
      backward ? PyArg_ParseTuple(args, "i(LLLLL)OOOO(fff)pi", &dtype_code, &s.tokens, &s.hidden, &s.rows,
                                  &s.queries, &s.weight_rows, &sources, &strides, &tensors, &grad_sources, &s.eps,
                                  &s.output_eps, &s.scale, &normalize_values, &call->max_threads)
               : PyArg_ParseTuple(args, "i(LLLLL)OOO(fff)piL", &dtype_code, &s.tokens, &s.hidden, &s.rows,
                                  &s.queries, &s.weight_rows, &sources, &strides, &tensors, &s.eps, &s.output_eps,
                                  &s.scale, &normalize_values, &call->max_threads, &call->stream_min_bytes);
  if (!parsed || !dtype_from_code(dtype_code, &s.dtype)) return false;
  s.normalize_values = normalize_values != 0;
  if (!addresses(sources, "sources must be a sequence of addresses", &call->sources) ||
      !integers(strides, "source_strides must be a sequence of ints", &call->strides) ||
      !addresses(tensors, "tensors must be a sequence of addresses", &call->tensors) ||
      (backward && !addresses(grad_sources, "grad_sources must be a sequence of addresses", &call->grad_sources))) {
    return false;
  }
  const std::string problem = call->problem(tensor_count, backward);
  if (!problem.empty()) {
    PyErr_Format(PyExc_ValueError, "BlockAttnResRead native kernel: %s", problem.c_str());
    return false;
  }
  s.sources = call->sources.data();
  s.source_strides = call->strides.data();
  return true;
}

// read_forward(dtype_code, (T, H, L, S, W), sources, source_strides, (query, key_weight, output_weight, out,
// inv_norm, probs, output_inv_rms), (eps, output_eps, scale), normalize_values, max_threads,
// stream_min_bytes): addresses, 0 for an absent tensor; the output goes by streaming stores from
// stream_min_bytes on, as make_launch's outputs do.
PyObject* read_forward(PyObject*, PyObject* args) {
  ReadCall call;
  if (!parse_read_call(args, false, 7, &call)) return nullptr;
  attnres::ReadForwardArgs kernel_args{};
  static_cast<attnres::ReadShape&>(kernel_args) = call.shape;
  const int64_t output_bytes = kernel_args.queries * kernel_args.tokens * kernel_args.hidden *
                               attnres::dtype_bytes(kernel_args.dtype);
  kernel_args.stream_stores = output_bytes >= call.stream_min_bytes;
  const std::vector<void*>& t = call.tensors;
  kernel_args.query = static_cast<const float*>(t[0]);
  kernel_args.key_weight = static_cast<const float*>(t[1]);
  kernel_args.output_weight = static_cast<const float*>(t[2]);
  kernel_args.out = t[3];
  kernel_args.inv_norm = static_cast<float*>(t[4]);
  kernel_args.probs = static_cast<float*>(t[5]);
  kernel_args.output_inv_rms = static_cast<float*>(t[6]);
  if (kernel_args.tokens == 0) Py_RETURN_NONE;  // nothing to write
  Py_BEGIN_ALLOW_THREADS {
    const attnres::TorchTeamScope team(attnres::bytes_moved(kernel_args), call.max_threads);
    attnres::block_attn_res_read_forward(kernel_args, call.max_threads);
  }
  Py_END_ALLOW_THREADS
  Py_RETURN_NONE;
}

// read_backward(dtype_code, (T, H, L, S, W), sources, source_strides, (grad_out, query, key_weight,
// output_weight, inv_norm, probs, output_inv_rms, grad_query, grad_key_weight, grad_output_weight),
// grad_sources, (eps, output_eps, scale), normalize_values, max_threads): addresses, 0 for an absent tensor.
PyObject* read_backward(PyObject*, PyObject* args) {
  ReadCall call;
  if (!parse_read_call(args, true, 10, &call)) return nullptr;
  attnres::ReadBackwardArgs kernel_args{};
  static_cast<attnres::ReadShape&>(kernel_args) = call.shape;
  const std::vector<void*>& t = call.tensors;
  kernel_args.grad_out = t[0];
  kernel_args.query = static_cast<const float*>(t[1]);
  kernel_args.key_weight = static_cast<const float*>(t[2]);
  kernel_args.output_weight = static_cast<const float*>(t[3]);
  kernel_args.inv_norm = static_cast<const float*>(t[4]);
  kernel_args.probs = static_cast<const float*>(t[5]);
  kernel_args.output_inv_rms = static_cast<const float*>(t[6]);
  kernel_args.grad_query = static_cast<float*>(t[7]);
  kernel_args.grad_key_weight = static_cast<float*>(t[8]);
  kernel_args.grad_output_weight = static_cast<float*>(t[9]);
  kernel_args.grad_sources = call.grad_sources.data();
  Py_BEGIN_ALLOW_THREADS {
    const attnres::TorchTeamScope team(attnres::bytes_moved(kernel_args), call.max_threads);
    attnres::block_attn_res_read_backward(kernel_args, call.max_threads);
  }
  Py_END_ALLOW_THREADS
  Py_RETURN_NONE;
}

// update_norm(record, inputs, outputs, output_weight, output_eps, max_threads): the kernel of a BlockAttnResUpdate
// launch record (its 6 inputs and 2 outputs, as launch takes them) with h normed by the output RMSNorm of
// weight [D] (float32, at address output_weight): BlockAttnResUpdateNorm, which has no record of its own.
PyObject* update_norm(PyObject*, PyObject* args) {
  PyObject *record, *inputs, *outputs, *weight;
  float output_eps;
  int max_threads;
  if (!PyArg_ParseTuple(args, "OOOOfi", &record, &inputs, &outputs, &weight, &output_eps, &max_threads)) {
    return nullptr;
  }
  auto* base = static_cast<const attnres::LaunchRecord*>(PyCapsule_GetPointer(record, attnres::kLaunchRecordCapsule));
  if (base == nullptr) return nullptr;
  auto* launch = dynamic_cast<const attnres::KernelLaunch<attnres::UpdateArgs>*>(base);
  if (launch == nullptr) {
    PyErr_SetString(PyExc_ValueError, "update_norm: the launch record is not BlockAttnResUpdate's");
    return nullptr;
  }
  std::vector<void*> input_addresses, output_addresses;
  if (!addresses(inputs, "inputs must be a sequence of addresses", &input_addresses) ||
      !addresses(outputs, "outputs must be a sequence of addresses", &output_addresses)) {
    return nullptr;
  }
  if (input_addresses.size() != 6 || output_addresses.size() != 2) {
    PyErr_Format(PyExc_ValueError, "update_norm: takes 6 inputs and 2 outputs, got %zu and %zu",
                 input_addresses.size(), output_addresses.size());
    return nullptr;
  }
  attnres::UpdateArgs kernel_args = launch->args();
  kernel_args.output_weight = static_cast<const float*>(PyLong_AsVoidPtr(weight));
  if (kernel_args.output_weight == nullptr) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "update_norm: output_weight is a null address");
    return nullptr;
  }
  kernel_args.output_eps = output_eps;
  Py_BEGIN_ALLOW_THREADS {
    const attnres::TorchTeamScope team(attnres::bytes_moved(kernel_args), max_threads);
    run_kernel(kernel_args, input_addresses.data(), output_addresses.data(), nullptr, max_threads);
  }
  Py_END_ALLOW_THREADS
  Py_RETURN_NONE;
}

PyObject* string_tuple(const std::vector<std::string>& names) {
  PyObject* tuple = PyTuple_New(static_cast<Py_ssize_t>(names.size()));
  if (tuple == nullptr) return nullptr;
  for (size_t i = 0; i < names.size(); ++i) {
    PyObject* name = PyUnicode_FromString(names[i].c_str());
    if (name == nullptr) {
      Py_DECREF(tuple);
      return nullptr;
    }
    PyTuple_SET_ITEM(tuple, static_cast<Py_ssize_t>(i), name);
  }
  return tuple;
}

PyObject* isa_path(PyObject*, PyObject*) { return PyUnicode_FromString(attnres::isa_path().c_str()); }
PyObject* known_isa_paths(PyObject*, PyObject*) { return string_tuple(attnres::known_isa_paths()); }
PyObject* available_isa_paths(PyObject*, PyObject*) { return string_tuple(attnres::available_isa_paths()); }

// select_isa_path(name): ValueError saying why when the path is unknown or this CPU lacks it.
PyObject* select_isa_path(PyObject*, PyObject* arg) {
  const char* name = PyUnicode_AsUTF8(arg);
  if (name == nullptr) return nullptr;
  const std::string problem = attnres::select_isa_path(name);
  if (!problem.empty()) {
    PyErr_SetString(PyExc_ValueError, problem.c_str());
    return nullptr;
  }
  Py_RETURN_NONE;
}

PyObject* last_call_threads(PyObject*, PyObject*) { return PyLong_FromLong(attnres::last_call_threads()); }
PyObject* torch_team_calls(PyObject*, PyObject*) { return PyLong_FromLongLong(attnres::torch_team_calls()); }
PyObject* openmp_team_min_bytes(PyObject*, PyObject* arg) {
  const long threads = PyLong_AsLong(arg);
  if (threads == -1 && PyErr_Occurred()) return nullptr;
  if (threads < 1 || threads > 1 << 20) {
    PyErr_Format(PyExc_ValueError, "openmp_team_min_bytes: threads must be in [1, 2^20], got %ld", threads);
    return nullptr;
  }
  return PyLong_FromLongLong(attnres::openmp_team_min_bytes(static_cast<int>(threads)));
}
PyObject* openmp_team_may_be_inherited(PyObject*, PyObject*) {
  attnres::openmp_team_may_be_inherited();
  Py_RETURN_NONE;
}

PyMethodDef kMethods[] = {
    {"record_layouts", record_layouts, METH_NOARGS, "each op's tiling record layout (checked by op_kernel.native)"},
    {"make_launch", make_launch, METH_VARARGS, "a launch record from a tiling record's bytes (see op_kernel.native)"},
    {"launch", launch, METH_VARARGS, "run a launch record's kernel (call through op_kernel.native)"},
    {"read_forward", read_forward, METH_VARARGS, "BlockAttnResRead's forward kernel (call through op_kernel.native)"},
    {"read_backward", read_backward, METH_VARARGS, "BlockAttnResRead's backward kernel (call through op_kernel.native)"},
    {"update_norm", update_norm, METH_VARARGS, "BlockAttnResUpdateNorm's kernel (call through op_kernel.native)"},
    {"isa_path", isa_path, METH_NOARGS, "the instruction set the kernels run on"},
    {"known_isa_paths", known_isa_paths, METH_NOARGS, "every instruction set path of this build"},
    {"available_isa_paths", available_isa_paths, METH_NOARGS, "the paths this CPU can run"},
    {"select_isa_path", select_isa_path, METH_O, "run the kernels on the named path"},
    {"last_call_threads", last_call_threads, METH_NOARGS, "threads the calling thread's latest kernel call used"},
    {"torch_team_calls", torch_team_calls, METH_NOARGS, "how many kernel calls ran on torch's OpenMP team"},
    {"openmp_team_min_bytes", openmp_team_min_bytes, METH_O,
     "the bytes a call on this many threads must move to run on torch's OpenMP team"},
    {"openmp_team_may_be_inherited", openmp_team_may_be_inherited, METH_NOARGS,
     "never run on torch's OpenMP team in this process (a forked child's team is its parent's)"},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef kModule = {
    PyModuleDef_HEAD_INIT, "_native", "Native CPU kernels of Block AttnRes (private: use op_kernel.native)", -1,
    kMethods,
};

}  // namespace

PyMODINIT_FUNC PyInit__native() {
  PyObject* module = PyModule_Create(&kModule);
  if (module == nullptr) return nullptr;
  // Constants the Python side must agree with; op_kernel/native.py asserts it at import.
  PyObject* dtype_codes = Py_BuildValue("{sisisi}", "float32", static_cast<int>(attnres::DType::kFloat32), "float16",
                                        static_cast<int>(attnres::DType::kFloat16), "bfloat16",
                                        static_cast<int>(attnres::DType::kBFloat16));
  if (PyModule_AddIntConstant(module, "LANES", attnres::kLanes) < 0 ||
      PyModule_AddObject(module, "DTYPE_CODES", dtype_codes) < 0) {
    Py_XDECREF(dtype_codes);
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
