// Python bindings of the native kernels: module attnres_ge.op_kernel._native.
//
// Plain Python C API, no torch or pybind11 headers: those would take a minute of
// the install's build time for what is a handful of integers per call.
//
//   forward_record / backward_record  a tiling record's fields -> a launch record
//                                     (capsule), once this module has checked that
//                                     they deal out exactly the tokens (chunks) and
//                                     tile exactly the hidden size
//   forward / backward                a launch record, data pointers and the thread limit
//                                     -> the kernel
//   KERNEL_TABLE                      the kernels, for the torch ops' C++ entry
//   isa_path, available_isa_paths,    the instruction set the kernels run on (dispatch.h)
//   known_isa_paths, select_isa_path
//   last_call_threads                 threads the calling thread's latest kernel call used
//
// The kernels walk the record, so they stay inside buffers of the record's sizes;
// that the pointers are such buffers is the caller's to guarantee: the Python
// wrappers (op_kernel/native.py) check every tensor, the host runtime's plans
// guarantee it by construction. It is private: call it only through the wrappers.

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdint>
#include <string>
#include <vector>

#include "attnres_native.h"
#include "dispatch.h"
#include "thread_pool.h"

namespace {

// "" when the record covers `items` and `hidden` exactly, else what is wrong.
std::string tiling_problem(int64_t items, int64_t hidden, int64_t used, int64_t former_num, int64_t former_len,
                           int64_t tail_len, int64_t tokens_per_loop, const attnres::HiddenTiles& tiles) {
  if (used < 1 || former_num < 0 || former_num > used || former_len < 0 || tail_len < 0) {
    return "bad core split: used_core_num=" + std::to_string(used) + ", former_core_num=" + std::to_string(former_num);
  }
  if (former_num * former_len + (used - former_num) * tail_len != items) {
    return "the core split does not cover " + std::to_string(items) + " items exactly";
  }
  if (tokens_per_loop < 1) return "tokens_per_loop must be >= 1, got " + std::to_string(tokens_per_loop);
  if (tiles.h_tile_num < 1 || tiles.h_last_tile < 1 || tiles.h_last_tile > tiles.h_tile ||
      (tiles.h_tile_num > 1 && tiles.h_tile % attnres::kLanes != 0) ||
      (tiles.h_tile_num - 1) * tiles.h_tile + tiles.h_last_tile != hidden) {
    return "hidden tiles h_tile=" + std::to_string(tiles.h_tile) + ", h_tile_num=" + std::to_string(tiles.h_tile_num) +
           ", h_last_tile=" + std::to_string(tiles.h_last_tile) + " do not tile H=" + std::to_string(hidden) +
           " with starts at multiples of " + std::to_string(attnres::kLanes);
  }
  return "";
}

bool dtype_from_code(int code, attnres::DType* dtype) {
  if (code < 0 || code > 2) {
    PyErr_Format(PyExc_ValueError, "attnres native kernel: unknown dtype code %d", code);
    return false;
  }
  *dtype = static_cast<attnres::DType>(code);
  return true;
}

template <typename P>
P* pointer(unsigned long long address) {
  return reinterpret_cast<P*>(static_cast<uintptr_t>(address));
}

template <typename Args>
void free_record(PyObject* capsule) {
  delete static_cast<Args*>(PyCapsule_GetPointer(capsule, PyCapsule_GetName(capsule)));
}

template <typename Args>
PyObject* record_capsule(const Args& args, const char* name) {
  auto* record = new Args(args);
  PyObject* capsule = PyCapsule_New(record, name, free_record<Args>);
  if (capsule == nullptr) delete record;
  return capsule;
}

// forward_record(dtype_code, tokens, blocks, hidden, used_core_num, former_core_num, former_core_tokens,
//                tail_core_tokens, tokens_per_loop, h_tile, h_tile_num, h_last_tile, norm_eps, stream_stores)
// -> a launch record (capsule kForwardRecordCapsule) once the fields tile the tokens and H exactly.
PyObject* forward_record(PyObject*, PyObject* args) {
  int dtype_code, stream_stores;
  long long tokens, blocks, hidden, used, former_num, former_tokens, tail_tokens, tokens_per_loop, h_tile,
      h_tile_num, h_last_tile;
  double norm_eps;
  if (!PyArg_ParseTuple(args, "iLLLLLLLLLLLdp", &dtype_code, &tokens, &blocks, &hidden, &used, &former_num,
                        &former_tokens, &tail_tokens, &tokens_per_loop, &h_tile, &h_tile_num, &h_last_tile, &norm_eps,
                        &stream_stores)) {
    return nullptr;
  }
  attnres::ForwardArgs a{};
  if (!dtype_from_code(dtype_code, &a.dtype)) return nullptr;
  a.tiles = {h_tile, h_tile_num, h_last_tile};
  const std::string problem =
      tiling_problem(tokens, hidden, used, former_num, former_tokens, tail_tokens, tokens_per_loop, a.tiles);
  if (!problem.empty()) {
    PyErr_Format(PyExc_ValueError, "BlockAttentionResiduals native kernel: %s", problem.c_str());
    return nullptr;
  }
  a.tokens = tokens;
  a.blocks = blocks;
  a.hidden = hidden;
  a.used_core_num = used;
  a.former_core_num = former_num;
  a.former_core_tokens = former_tokens;
  a.tail_core_tokens = tail_tokens;
  a.tokens_per_loop = tokens_per_loop;
  a.norm_eps = static_cast<float>(norm_eps);
  a.stream_stores = stream_stores != 0;
  return record_capsule(a, attnres::kForwardRecordCapsule);
}

// backward_record(dtype_code, tokens, blocks, hidden, used_core_num, former_core_num, former_core_chunks,
//                 tail_core_chunks, chunk_tokens, chunk_num, tokens_per_loop, h_tile, h_tile_num, h_last_tile,
//                 stream_stores) -> a launch record (capsule kBackwardRecordCapsule), checked likewise.
PyObject* backward_record(PyObject*, PyObject* args) {
  int dtype_code, stream_stores;
  long long tokens, blocks, hidden, used, former_num, former_chunks, tail_chunks, chunk_tokens, chunk_num,
      tokens_per_loop, h_tile, h_tile_num, h_last_tile;
  if (!PyArg_ParseTuple(args, "iLLLLLLLLLLLLLp", &dtype_code, &tokens, &blocks, &hidden, &used, &former_num,
                        &former_chunks, &tail_chunks, &chunk_tokens, &chunk_num, &tokens_per_loop, &h_tile,
                        &h_tile_num, &h_last_tile, &stream_stores)) {
    return nullptr;
  }
  attnres::BackwardArgs a{};
  if (!dtype_from_code(dtype_code, &a.dtype)) return nullptr;
  a.tiles = {h_tile, h_tile_num, h_last_tile};
  std::string problem =
      tiling_problem(chunk_num, hidden, used, former_num, former_chunks, tail_chunks, tokens_per_loop, a.tiles);
  if (problem.empty() && (chunk_tokens < 1 || chunk_num != (tokens + chunk_tokens - 1) / chunk_tokens)) {
    problem = "chunk_num " + std::to_string(chunk_num) + " does not match " + std::to_string(tokens) +
              " tokens in chunks of " + std::to_string(chunk_tokens);
  }
  if (!problem.empty()) {
    PyErr_Format(PyExc_ValueError, "BlockAttentionResidualsGrad native kernel: %s", problem.c_str());
    return nullptr;
  }
  a.tokens = tokens;
  a.blocks = blocks;
  a.hidden = hidden;
  a.used_core_num = used;
  a.former_core_num = former_num;
  a.former_core_chunks = former_chunks;
  a.tail_core_chunks = tail_chunks;
  a.chunk_tokens = chunk_tokens;
  a.chunk_num = chunk_num;
  a.tokens_per_loop = tokens_per_loop;
  a.stream_stores = stream_stores != 0;
  return record_capsule(a, attnres::kBackwardRecordCapsule);
}

// The record a capsule holds (a copy), or false with a Python error set.
template <typename Args>
bool record_from(PyObject* capsule, const char* name, Args* args) {
  auto* record = static_cast<Args*>(PyCapsule_GetPointer(capsule, name));
  if (record == nullptr) return false;  // not a capsule of that name: TypeError/ValueError set
  *args = *record;
  return true;
}

// forward(record, partial_block, block_res, proj_weight, norm_weight, hidden_states, inv_norm, probs, max_threads)
// Pointers are data addresses; inv_norm and probs are 0 when the statistics are not wanted.
PyObject* forward(PyObject*, PyObject* args) {
  PyObject* record;
  unsigned long long partial, blocks_ptr, proj, norm, hidden_states, inv_norm, probs;
  int max_threads;
  if (!PyArg_ParseTuple(args, "OKKKKKKKi", &record, &partial, &blocks_ptr, &proj, &norm, &hidden_states, &inv_norm,
                        &probs, &max_threads)) {
    return nullptr;
  }
  attnres::ForwardArgs a;
  if (!record_from(record, attnres::kForwardRecordCapsule, &a)) return nullptr;
  if ((inv_norm == 0) != (probs == 0)) {
    PyErr_SetString(PyExc_ValueError, "BlockAttentionResiduals native kernel: inv_norm and probs go together");
    return nullptr;
  }
  a.partial_block = pointer<const void>(partial);
  a.block_res = pointer<const void>(blocks_ptr);
  a.proj_weight = pointer<const void>(proj);
  a.norm_weight = pointer<const void>(norm);
  a.hidden_states = pointer<void>(hidden_states);
  a.inv_norm = pointer<float>(inv_norm);
  a.probs = pointer<float>(probs);
  if (a.tokens > 0) {
    Py_BEGIN_ALLOW_THREADS attnres::block_attention_residuals_forward(a, max_threads);
    Py_END_ALLOW_THREADS
  }
  Py_RETURN_NONE;
}

// backward(record, partial_block, block_res, proj_weight, norm_weight, grad_hidden_states, inv_norm, probs,
//          grad_partial_block, grad_block_res, grad_proj_weight, grad_norm_weight, workspace, max_threads)
PyObject* backward(PyObject*, PyObject* args) {
  PyObject* record;
  unsigned long long partial, blocks_ptr, proj, norm, grad_hidden, inv_norm, probs, grad_partial, grad_blocks,
      grad_proj, grad_norm, workspace;
  int max_threads;
  if (!PyArg_ParseTuple(args, "OKKKKKKKKKKKKi", &record, &partial, &blocks_ptr, &proj, &norm, &grad_hidden,
                        &inv_norm, &probs, &grad_partial, &grad_blocks, &grad_proj, &grad_norm, &workspace,
                        &max_threads)) {
    return nullptr;
  }
  attnres::BackwardArgs a;
  if (!record_from(record, attnres::kBackwardRecordCapsule, &a)) return nullptr;
  a.partial_block = pointer<const void>(partial);
  a.block_res = pointer<const void>(blocks_ptr);
  a.proj_weight = pointer<const void>(proj);
  a.norm_weight = pointer<const void>(norm);
  a.grad_hidden_states = pointer<const void>(grad_hidden);
  a.inv_norm = pointer<const float>(inv_norm);
  a.probs = pointer<const float>(probs);
  a.grad_partial_block = pointer<void>(grad_partial);
  a.grad_block_res = pointer<void>(grad_blocks);
  a.grad_proj_weight = pointer<void>(grad_proj);
  a.grad_norm_weight = pointer<void>(grad_norm);
  a.chunk_rows = pointer<float>(workspace);
  Py_BEGIN_ALLOW_THREADS attnres::block_attention_residuals_backward(a, max_threads);
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

attnres::KernelTable kKernelTable{attnres::block_attention_residuals_forward,
                                  attnres::block_attention_residuals_backward};

PyMethodDef kMethods[] = {
    {"forward_record", forward_record, METH_VARARGS, "BlockAttentionResiduals launch record (see op_kernel.native)"},
    {"backward_record", backward_record, METH_VARARGS,
     "BlockAttentionResidualsGrad launch record (see op_kernel.native)"},
    {"forward", forward, METH_VARARGS, "BlockAttentionResiduals kernel (call through op_kernel.native)"},
    {"backward", backward, METH_VARARGS, "BlockAttentionResidualsGrad kernel (call through op_kernel.native)"},
    {"isa_path", isa_path, METH_NOARGS, "the instruction set the kernels run on"},
    {"known_isa_paths", known_isa_paths, METH_NOARGS, "every instruction set path of this build"},
    {"available_isa_paths", available_isa_paths, METH_NOARGS, "the paths this CPU can run"},
    {"select_isa_path", select_isa_path, METH_O, "run the kernels on the named path"},
    {"last_call_threads", last_call_threads, METH_NOARGS, "threads the calling thread's latest kernel call used"},
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
  if (PyModule_AddIntConstant(module, "LANES", attnres::kLanes) < 0 ||
      PyModule_AddObject(module, "KERNEL_TABLE", PyCapsule_New(&kKernelTable, attnres::kKernelTableCapsule, nullptr)) <
          0) {
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
