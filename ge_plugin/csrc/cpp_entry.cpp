// The ops' C++ entry: module attnres_ge.ge_plugin._cpp_entry.
//
// Registered in Python, a call of torch.ops.attnres.block_attention_residuals crosses
// from the dispatcher into Python twice (the autograd kernel, then the CPU kernel), and
// the Python entry then plans, allocates and launches: 60-80 us a call on a 2-core host,
// more than a decode step's kernel; a compiled graph's node spent as much in the local
// GE's Python. This module keeps, per input signature, a launch that needs no Python:
//
//   register_eager(op_name)  the op's CPU kernel (eager calls: fresh outputs, a reference output written
//               into its input), one boxed
//               kernel for every op: tensors and attributes are read from the op's schema
//   register_autograd()  the Autograd kernels of the two Block AttnRes ops, their own formulas in C++
//               (block_attention_residuals_autograd.h)
//   set_autograd_formulas()  the Python functions those two call for the rare derivatives
//   register_gradient_in_python(op_name, on_gradient)  the Autograd kernel of an op whose derivative (or
//               refusal to have one) is Python's: Python is called only for a call that needs a gradient
//   GraphNode   one compiled GE node of the local GE: outputs and workspace planned once
//               per signature and reused only when provably free (GraphNode::Slot: the rule
//               op_kernel/buffer_pool.py applies too); a reference output written into its input
//
// A signature not seen yet goes to Python, which validates and plans (op_kernel.launcher) as it
// always has, so every error message is the Python one, and hands back a repeatable launch: the
// plan's launch record (op_kernel/csrc/launch_record.h: it knows its op's kernel and how to bind
// the data pointers), the outputs' shapes and dtypes, the workspace size. It hands back none when
// the Python kernels are active, and Python then runs the call itself. Repeats launch the very
// record the plan made, on the same kernels: the same bits. forget() drops every cached launch
// (Python calls it when the kernel implementation changes). Large eager outputs come from a
// huge-page pool (huge_page_pool.h), a first call's too (Python asks for them: empty_output); a
// repeat's workspace is its calling thread's (eager_workspace).
// Nothing here but the included autograd file knows an op.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/add.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/library.h>

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "../../op_kernel/csrc/launch_record.h"
#include "huge_page_pool.h"

namespace py = pybind11;

namespace {

using Key = std::vector<int64_t>;

struct OutputMeta {
  std::vector<int64_t> sizes;
  at::ScalarType dtype;
};

// What a repeat of one planned signature needs besides the tensors.
struct Launch {
  std::unique_ptr<const attnres::LaunchRecord> record;
  std::vector<OutputMeta> outputs;
  std::vector<int64_t> updated_inputs;  // per output: the input it is written into (a reference output), or -1
  int64_t workspace_bytes = 0;
};

struct KeyHash {
  size_t operator()(const Key& key) const {
    size_t hash = 1469598103934665603ull;
    for (int64_t value : key) hash = (hash ^ static_cast<size_t>(value)) * 1099511628211ull;
    return hash;
  }
};

class GraphNode;

// Idle eager-output mappings kept for reuse, at most.
constexpr int64_t kMaxIdleOutputBytes = int64_t{512} << 20;

struct EntryState {
  py::object first_call;          // op_common._first_call
  size_t max_eager_signatures = 0;  // op_kernel.launcher.PLAN_CACHE_SIZE, given at install
  // Eager outputs of output_pool_min_bytes or more come from output_pool (0: none do), given at install.
  std::shared_ptr<HugePagePool> output_pool = std::make_shared<HugePagePool>(kMaxIdleOutputBytes);
  int64_t output_pool_min_bytes = 0;
  std::vector<std::string> eager_ops;  // an op's index here is the first element of its eager keys
  std::mutex mutex;
  std::unordered_map<Key, std::shared_ptr<const Launch>, KeyHash> eager_launches;
  std::vector<std::weak_ptr<GraphNode>> graph_nodes;
  std::vector<std::unique_ptr<torch::Library>> registrations;
};

EntryState& state() {
  static auto* instance = new EntryState();  // never destroyed: the dispatcher may call in at exit
  return *instance;
}

// `first` (which op, for eager keys), then per tensor its device, dtype, rank and sizes, then the attributes.
Key signature(int64_t first, const std::vector<at::Tensor>& tensors, const std::vector<int64_t>& attrs = {}) {
  Key key{first};
  for (const at::Tensor& tensor : tensors) {
    key.push_back(static_cast<int64_t>(tensor.device().type()) << 8 | (tensor.device().index() + 1));
    key.push_back(static_cast<int64_t>(tensor.scalar_type()));
    key.push_back(tensor.dim());
    for (int64_t size : tensor.sizes()) key.push_back(size);
  }
  key.insert(key.end(), attrs.begin(), attrs.end());
  return key;
}

int64_t bits_of(double value) {
  int64_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

// A repeatable launch from Python's (launch record, workspace_bytes, [(shape, dtype), ...], [updated input
// index or -1 per output]); null for None.
std::shared_ptr<const Launch> launch_from(const py::object& answer) {
  if (answer.is_none()) return nullptr;
  auto fields = answer.cast<py::tuple>();
  auto launch = std::make_shared<Launch>();
  auto* record = static_cast<const attnres::LaunchRecord*>(PyCapsule_GetPointer(fields[0].ptr(),
                                                                                attnres::kLaunchRecordCapsule));
  if (record == nullptr) throw py::error_already_set();
  launch->record = record->clone();
  launch->workspace_bytes = fields[1].cast<int64_t>();
  for (const auto& meta : fields[2].cast<py::list>()) {
    auto shape_and_dtype = meta.cast<py::tuple>();
    launch->outputs.push_back({shape_and_dtype[0].cast<std::vector<int64_t>>(), shape_and_dtype[1].cast<at::ScalarType>()});
  }
  launch->updated_inputs = fields[3].cast<std::vector<int64_t>>();
  return launch;
}

at::Tensor empty_buffer(const OutputMeta& meta) { return at::empty(meta.sizes, at::dtype(meta.dtype)); }

at::Tensor empty_workspace(int64_t bytes) { return at::empty({bytes}, at::dtype(at::kByte)); }

// A fresh output of an eager call: from the huge-page pool when it is large enough, else torch's allocator.
at::Tensor eager_output(const OutputMeta& meta) {
  int64_t bytes = static_cast<int64_t>(c10::elementSize(meta.dtype));
  for (int64_t size : meta.sizes) bytes *= size;
  std::shared_ptr<HugePagePool> pool;
  {
    EntryState& entry = state();
    std::lock_guard<std::mutex> lock(entry.mutex);
    if (entry.output_pool_min_bytes > 0 && bytes >= entry.output_pool_min_bytes) pool = entry.output_pool;
  }
  return pool ? pool->empty(meta.sizes, meta.dtype) : empty_buffer(meta);
}

// A buffer a graph node plans once and reuses, as op_kernel/host_memory.py's empty_planned makes it:
// torch's allocator, and from huge_page_min_bytes on (0: never) the 2 MiB-aligned part of its memory
// advised to use transparent huge pages before anything touches it.
at::Tensor planned(at::Tensor buffer, int64_t huge_page_min_bytes) {
  constexpr uintptr_t kHugePage = uintptr_t{2} << 20;
  const auto nbytes = static_cast<int64_t>(buffer.storage().nbytes());
  if (huge_page_min_bytes > 0 && nbytes >= huge_page_min_bytes) {
    const auto address = reinterpret_cast<uintptr_t>(buffer.storage().data());
    const uintptr_t start = (address + kHugePage - 1) / kHugePage * kHugePage;
    const uintptr_t stop = (address + static_cast<uintptr_t>(nbytes)) / kHugePage * kHugePage;
    if (stop > start) madvise(reinterpret_cast<void*>(start), stop - start, MADV_HUGEPAGE);  // advice only
  }
  return buffer;
}

// Eager workspaces up to this size are kept by their calling thread between calls.
constexpr int64_t kMaxKeptWorkspaceBytes = int64_t{16} << 20;

std::atomic<int64_t> g_kept_workspace_allocations{0};  // tests watch reuse through it

// The workspace of a cached eager call: scratch its kernel uses only while it runs, so each calling
// thread keeps one of up to kMaxKeptWorkspaceBytes, grown to the largest size it was asked for (a fresh
// one costs a page fault per 4 KiB on every call: the backward's 512 KiB at T=4096, H=2048). A larger
// one is taken as a large output is (eager_output: the huge-page pool) and returned with the call.
at::Tensor eager_workspace(int64_t bytes) {
  if (bytes <= 0) return at::Tensor();
  if (bytes > kMaxKeptWorkspaceBytes) return eager_output({{bytes}, at::kByte});
  thread_local at::Tensor kept;
  if (!kept.defined() || kept.numel() < bytes) {
    kept = empty_workspace(bytes);
    ++g_kept_workspace_allocations;
  }
  return kept;
}

// Runs the kernel of `launch` on contiguous inputs (prototype order) and outputs of its planned shapes.
void run(const Launch& launch, const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs,
         const at::Tensor& workspace) {
  std::vector<const void*> input_data;
  for (const at::Tensor& input : inputs) input_data.push_back(input.const_data_ptr());
  std::vector<void*> output_data;  // null for an empty output, as the launch records expect
  for (const at::Tensor& output : outputs) output_data.push_back(output.numel() ? output.mutable_data_ptr() : nullptr);
  void* workspace_data = workspace.defined() && workspace.numel() ? workspace.mutable_data_ptr() : nullptr;
  launch.record->run(input_data.data(), output_data.data(), workspace_data, at::get_num_threads());  // torch's limit
}

std::vector<at::Tensor> contiguous(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> result;
  result.reserve(tensors.size());
  for (const at::Tensor& tensor : tensors) result.push_back(tensor.contiguous());
  return result;
}

// ---------------------------------------------------------------------------------------------- eager

std::shared_ptr<const Launch> cached_eager_launch(const Key& key) {
  EntryState& entry = state();
  std::lock_guard<std::mutex> lock(entry.mutex);
  auto found = entry.eager_launches.find(key);
  return found == entry.eager_launches.end() ? nullptr : found->second;
}

bool all_defined(const std::vector<at::Tensor>& tensors) {
  return std::all_of(tensors.begin(), tensors.end(), [](const at::Tensor& tensor) { return tensor.defined(); });
}

// [first, last) bytes of its storage a tensor may touch (as op_common._byte_span); empty for no element.
std::pair<int64_t, int64_t> byte_span(const at::Tensor& tensor) {
  if (tensor.numel() == 0) return {0, 0};
  int64_t extent = 1;
  for (int64_t dim = 0; dim < tensor.dim(); ++dim) extent += (tensor.size(dim) - 1) * std::abs(tensor.stride(dim));
  const int64_t first = tensor.storage_offset() * static_cast<int64_t>(tensor.element_size());
  return {first, first + extent * static_cast<int64_t>(tensor.element_size())};
}

bool may_overlap(const at::Tensor& a, const at::Tensor& b) {
  if (!a.storage().is_alias_of(b.storage())) return false;
  const auto [a0, a1] = byte_span(a);
  const auto [b0, b1] = byte_span(b);
  return a0 < b1 && b0 < a1;
}

// Whether a cached launch may write its reference outputs straight into their inputs: each such input is
// contiguous and shares no memory with another input. Otherwise Python runs the call, the eager entry or
// the graph's run (it copies a non-contiguous input back, and names an overlap in its error).
bool updates_in_place(const Launch& launch, const std::vector<at::Tensor>& inputs) {
  for (int64_t updated : launch.updated_inputs) {
    if (updated < 0) continue;
    const at::Tensor& target = inputs[updated];
    if (!target.is_contiguous()) return false;
    for (size_t other = 0; other < inputs.size(); ++other) {
      if (static_cast<int64_t>(other) != updated && may_overlap(target, inputs[other])) return false;
    }
  }
  return true;
}

// The Python value of a scalar attribute.
py::object python_value(const c10::IValue& value) {
  if (value.isBool()) return py::bool_(value.toBool());
  if (value.isInt()) return py::int_(value.toInt());
  if (value.isDouble()) return py::float_(value.toDouble());
  throw std::runtime_error("attnres_ge._cpp_entry: attributes must be bool, int or float, got " + value.tagKind());
}

// The part of an eager key an attribute takes: its value, or a float's bits.
int64_t key_of(const c10::IValue& value) {
  if (value.isDouble()) return bits_of(value.toDouble());
  return value.isBool() ? static_cast<int64_t>(value.toBool()) : value.toInt();
}

// The CPU kernel of every op registered with register_eager: reads the tensors and attributes as
// the schema lists them; runs the cached launch of their signature (run_cached), or asks the
// Python entry (whose launch is then cached). A None input (an undefined tensor) has no
// signature: Python's validation names it.
class EagerKernel final : public c10::OperatorKernel {
 public:
  explicit EagerKernel(int64_t op) : op_(op) {}

  void operator()(const c10::OperatorHandle& handle, c10::DispatchKeySet, torch::jit::Stack* stack) {
    const auto& arguments = handle.schema().arguments();
    std::vector<at::Tensor> inputs;
    std::vector<std::pair<std::string, c10::IValue>> attrs;
    std::vector<int64_t> attr_key;
    auto values = torch::jit::last(*stack, arguments.size());
    for (size_t index = 0; index < arguments.size(); ++index) {
      const c10::IValue& value = values[index];
      if (arguments[index].type()->kind() == c10::TypeKind::TensorType) {
        inputs.push_back(value.isTensor() ? value.toTensor() : at::Tensor());
      } else {
        attrs.emplace_back(arguments[index].name(), value);
        attr_key.push_back(key_of(value));
      }
    }
    std::vector<at::Tensor> outputs = call(inputs, attrs, attr_key);
    torch::jit::drop(*stack, arguments.size());
    for (at::Tensor& output : outputs) stack->emplace_back(std::move(output));
  }

 private:
  std::vector<at::Tensor> call(const std::vector<at::Tensor>& inputs,
                               const std::vector<std::pair<std::string, c10::IValue>>& attrs,
                               const std::vector<int64_t>& attr_key) const {
    const bool cacheable = all_defined(inputs);
    const Key key = cacheable ? signature(op_, inputs, attr_key) : Key{};
    if (auto launch = cacheable ? cached_eager_launch(key) : nullptr) {
      if (updates_in_place(*launch, inputs)) return run_cached(*launch, inputs);
    }
    py::gil_scoped_acquire gil;
    EntryState& entry = state();
    py::dict python_attrs;
    for (const auto& [name, value] : attrs) python_attrs[py::str(name)] = python_value(value);
    // Python errors propagate as they are.
    auto answer = entry.first_call(entry.eager_ops[op_], inputs, python_attrs).cast<py::tuple>();
    if (auto launch = cacheable ? launch_from(answer[1]) : nullptr) {
      std::lock_guard<std::mutex> lock(entry.mutex);
      if (entry.eager_launches.size() >= entry.max_eager_signatures) entry.eager_launches.clear();
      entry.eager_launches.emplace(key, std::move(launch));
    }
    return answer[0].cast<std::vector<at::Tensor>>();
  }

  // The cached launch with fresh outputs, the reference ones written into their inputs (whose version
  // is bumped, as an in-place op's); returns the fresh ones, as the schema does.
  static std::vector<at::Tensor> run_cached(const Launch& launch, const std::vector<at::Tensor>& inputs) {
    std::vector<at::Tensor> outputs, fresh;
    for (size_t index = 0; index < launch.outputs.size(); ++index) {
      const int64_t updated = launch.updated_inputs[index];
      outputs.push_back(updated >= 0 ? inputs[updated] : eager_output(launch.outputs[index]));
      if (updated < 0) fresh.push_back(outputs.back());
    }
    run(launch, contiguous(inputs), outputs, eager_workspace(launch.workspace_bytes));
    for (int64_t updated : launch.updated_inputs) {
      if (updated >= 0) inputs[updated].unsafeGetTensorImpl()->bump_version();
    }
    return fresh;
  }

  const int64_t op_;
};

// ---------------------------------------------------------------------------------------------- autograd

#include "block_attention_residuals_autograd.h"

// ---------------------------------------------------------------------------------------------- graph nodes

// A compiled graph of one custom op fed straight by its Data nodes (what the backend's converters
// build), called with the graph inputs in Data index order.
class GraphNode {
 public:
  // input_order[i]: the graph input feeding the op's input i; result_order[j]: the op output that is
  // graph result j. plan(inputs) validates and returns a repeatable launch or None; run(inputs) runs
  // the graph in Python (its answer for None). Buffers are kept for the max_signatures most recently
  // used signatures.
  GraphNode(std::vector<int64_t> input_order, std::vector<int64_t> result_order, py::object plan, py::object run,
            size_t max_signatures, int64_t huge_page_min_bytes)
      : input_order_(std::move(input_order)),
        result_order_(std::move(result_order)),
        plan_(std::move(plan)),
        run_(std::move(run)),
        max_signatures_(std::max<size_t>(max_signatures, 1)),
        huge_page_min_bytes_(huge_page_min_bytes) {}

  // A reference output (Launch::updated_inputs) is the fed input itself, written in place and its
  // version bumped, as the eager op and the Python run give it; where the fed input is not contiguous
  // or shares memory with another input, the graph runs in Python (which copies it back, or names the
  // overlap in its error).
  py::object call(const std::vector<at::Tensor>& graph_inputs) {
    const Key key = signature(0, graph_inputs);
    std::shared_ptr<const Launch> launch;
    std::vector<at::Tensor> buffers;  // outputs (undefined for a reference output), then the workspace
    if (!take(key, &launch, &buffers)) {
      launch = launch_from(plan_(graph_inputs));  // the GIL is held: called from Python
      if (launch == nullptr) return run_(graph_inputs);
      buffers = remember(key, launch);
    }
    std::vector<at::Tensor> fed;
    for (int64_t index : input_order_) fed.push_back(graph_inputs[index]);
    if (!updates_in_place(*launch, fed)) return run_(graph_inputs);
    std::vector<at::Tensor> outputs(buffers.begin(), buffers.end() - 1);
    for (size_t index = 0; index < outputs.size(); ++index) {
      if (launch->updated_inputs[index] >= 0) outputs[index] = fed[launch->updated_inputs[index]];
    }
    {
      py::gil_scoped_release no_gil;
      run(*launch, contiguous(fed), outputs, buffers.back());
    }
    for (int64_t updated : launch->updated_inputs) {
      if (updated >= 0) fed[updated].unsafeGetTensorImpl()->bump_version();
    }
    py::list results;
    for (int64_t index : result_order_) results.append(outputs[index]);
    return std::move(results);
  }

  void forget() {
    std::lock_guard<std::mutex> lock(mutex_);
    planned_.clear();
  }

  size_t planned_signatures() {
    std::lock_guard<std::mutex> lock(mutex_);
    return planned_.size();
  }

  int64_t allocations() {
    std::lock_guard<std::mutex> lock(mutex_);
    return allocations_;
  }

 private:
  // One buffer, and the allocation it was planned with. The reuse rule (docs/memory.md), shared with
  // ge_plugin/buffer_pool.py: a slot is written again only when nothing but the slot references its
  // storage (no tensor, view, storage object or weak reference) and the storage still owns the very
  // allocation the slot made: same data pointer, same size, same deleter. A storage resized by its
  // holder (resize_(0), FSDP2's resize_storage_bytes_) or moved to shared memory (share_memory_(), a
  // torch.multiprocessing queue: another process may map it) fails that test and is replaced.
  // A reference output's slot holds no tensor (the output is the fed input).
  struct Slot {
    explicit Slot(at::Tensor buffer)
        : tensor(std::move(buffer)),
          data(tensor.defined() ? tensor.storage().data() : nullptr),
          nbytes(tensor.defined() ? tensor.storage().nbytes() : 0),
          deleter(tensor.defined() ? tensor.storage().data_ptr().get_deleter() : nullptr) {}

    bool reusable() const {
      if (!tensor.defined()) return true;
      const c10::Storage& storage = tensor.storage();
      // Weak references: the strong ones together count as one, and `probe` is one more.
      const c10::weak_intrusive_ptr<c10::StorageImpl> probe = storage.getWeakStorageImpl();
      return storage.use_count() == 1 && probe.weak_use_count() == 2 && storage.data() == data &&
             storage.nbytes() == nbytes && storage.data_ptr().get_deleter() == deleter;
    }

    at::Tensor tensor;
    const void* data;
    size_t nbytes;
    c10::DeleterFnPtr deleter;
  };

  struct Planned {
    Key key;
    std::shared_ptr<const Launch> launch;
    std::vector<Slot> slots;  // one per output, then the workspace
  };

  // For a planned `key`: its launch, and tensors over its slots for one run. A slot that is not
  // provably free (reusable()) gets a fresh storage first, so a run never writes what anyone can
  // still reach. Each run hands out new tensors (detach), so holding a result, or a view of it,
  // raises its storage's use count above the slot's own one. False when `key` is not planned.
  bool take(const Key& key, std::shared_ptr<const Launch>* launch, std::vector<at::Tensor>* buffers) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = std::find_if(planned_.begin(), planned_.end(), [&](const Planned& p) { return p.key == key; });
    if (found == planned_.end()) return false;
    std::rotate(found, found + 1, planned_.end());  // now the most recently used
    Planned* planned = &planned_.back();
    for (size_t index = 0; index < planned->slots.size(); ++index) {
      Slot& slot = planned->slots[index];
      if (!slot.reusable()) {
        slot = Slot(planned_slot(*planned->launch, index));
        ++allocations_;
      }
      buffers->push_back(slot.tensor.defined() ? slot.tensor.detach() : at::Tensor());
    }
    *launch = planned->launch;
    return true;
  }

  // Plans `key` with fresh slots (dropping the least recently used signature beyond the bound);
  // tensors over them for this run.
  std::vector<at::Tensor> remember(const Key& key, const std::shared_ptr<const Launch>& launch) {
    std::vector<Slot> slots;
    std::vector<at::Tensor> buffers;
    for (size_t index = 0; index <= launch->outputs.size(); ++index) slots.emplace_back(planned_slot(*launch, index));
    for (const Slot& slot : slots) buffers.push_back(slot.tensor.defined() ? slot.tensor.detach() : at::Tensor());
    std::lock_guard<std::mutex> lock(mutex_);
    allocations_ += std::count_if(slots.begin(), slots.end(), [](const Slot& slot) { return slot.tensor.defined(); });
    if (planned_.size() >= max_signatures_) planned_.erase(planned_.begin());
    planned_.push_back({key, launch, std::move(slots)});
    return buffers;
  }

  // Slot `index` of `launch`: its outputs (none for a reference output), then the workspace.
  at::Tensor planned_slot(const Launch& launch, size_t index) const {
    if (index < launch.outputs.size() && launch.updated_inputs[index] >= 0) return at::Tensor();
    return planned(index < launch.outputs.size() ? empty_buffer(launch.outputs[index])
                                                 : empty_workspace(launch.workspace_bytes),
                   huge_page_min_bytes_);
  }

  const std::vector<int64_t> input_order_, result_order_;
  const py::object plan_, run_;
  const size_t max_signatures_;
  const int64_t huge_page_min_bytes_;  // op_kernel.host_memory.huge_page_min_bytes()
  std::mutex mutex_;
  std::vector<Planned> planned_;  // least recently used first
  int64_t allocations_ = 0;       // storages allocated so far (tests watch reuse through it)
};

std::shared_ptr<GraphNode> make_graph_node(std::vector<int64_t> input_order, std::vector<int64_t> result_order,
                                           py::object plan, py::object run, size_t max_signatures,
                                           int64_t huge_page_min_bytes) {
  auto node = std::make_shared<GraphNode>(std::move(input_order), std::move(result_order), std::move(plan),
                                          std::move(run), max_signatures, huge_page_min_bytes);
  EntryState& entry = state();
  std::lock_guard<std::mutex> lock(entry.mutex);
  auto& nodes = entry.graph_nodes;
  nodes.erase(std::remove_if(nodes.begin(), nodes.end(), [](const auto& weak) { return weak.expired(); }),
              nodes.end());
  nodes.push_back(node);
  return node;
}

// ---------------------------------------------------------------------------------------------- module

// Makes `first_call` the Python entry for eager signatures not cached: first_call(op_name, inputs, attrs)
// -> (outputs, repeatable launch or None); at most `max_signatures` eager signatures are cached. Eager
// outputs of `output_pool_min_bytes` or more (0: none) come from the huge-page pool.
void install(py::object first_call, size_t max_signatures, int64_t output_pool_min_bytes) {
  EntryState& entry = state();
  if (entry.first_call) throw std::runtime_error("attnres_ge._cpp_entry: install() was called already");
  entry.first_call = std::move(first_call);
  entry.max_eager_signatures = std::max<size_t>(max_signatures, 1);
  std::lock_guard<std::mutex> lock(entry.mutex);
  entry.output_pool_min_bytes = output_pool_min_bytes;
}

// Makes eager outputs of `min_bytes` or more (0: none) come from `pool`; returns the pool and size used
// until now (tests swap in a pool of their own).
std::pair<std::shared_ptr<HugePagePool>, int64_t> use_output_pool(std::shared_ptr<HugePagePool> pool,
                                                                    int64_t min_bytes) {
  if (!pool) throw std::invalid_argument("attnres_ge._cpp_entry.use_output_pool: pool must not be None");
  EntryState& entry = state();
  std::lock_guard<std::mutex> lock(entry.mutex);
  std::pair<std::shared_ptr<HugePagePool>, int64_t> previous{entry.output_pool, entry.output_pool_min_bytes};
  entry.output_pool = std::move(pool);
  entry.output_pool_min_bytes = min_bytes;
  return previous;
}

// The Autograd kernel of an op whose derivative, if it has one, is Python's: a call that needs a gradient
// (grad mode on, a tensor argument requiring grad) goes to Python's on_gradient(*arguments), which returns
// the op's outputs with their autograd history, or raises (an op without a derivative); any other call
// goes on below autograd without Python.
class GradientInPythonKernel final : public c10::OperatorKernel {
 public:
  // The reference to `on_gradient` is never dropped: the dispatcher may destroy its kernels at exit,
  // after Python has finalized, when no reference may be touched.
  explicit GradientInPythonKernel(py::object on_gradient) : on_gradient_(on_gradient.release()) {}

  void operator()(const c10::OperatorHandle& handle, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
    if (c10::GradMode::is_enabled() && needs_gradient(handle, *stack)) {
      call_python(handle, stack);
      return;
    }
    handle.redispatchBoxed(keys & c10::after_autograd_keyset, stack);
  }

 private:
  static bool needs_gradient(const c10::OperatorHandle& handle, const torch::jit::Stack& stack) {
    for (const auto& value : torch::jit::last(stack, handle.schema().arguments().size())) {
      if (value.isTensor() && value.toTensor().requires_grad()) return true;
    }
    return false;
  }

  // The arguments off the stack into on_gradient, its outputs (one, or a tuple of several) onto it.
  void call_python(const c10::OperatorHandle& handle, torch::jit::Stack* stack) {
    const auto& schema = handle.schema();
    std::vector<c10::IValue> values = torch::jit::pop(*stack, schema.arguments().size());
    py::gil_scoped_acquire gil;
    py::tuple arguments(values.size());
    for (size_t index = 0; index < values.size(); ++index) arguments[index] = torch::jit::toPyObject(values[index]);
    py::object outputs = on_gradient_(*arguments);  // Python errors propagate as they are
    const auto& returns = schema.returns();
    if (returns.size() == 1) {
      stack->push_back(torch::jit::toIValue(outputs, returns[0].type()));
      return;
    }
    py::tuple items = py::cast<py::tuple>(outputs);
    if (items.size() != returns.size()) {
      throw std::runtime_error("attnres_ge._cpp_entry: " + schema.name() + "'s Python autograd returned " +
                               std::to_string(items.size()) + " outputs, not " + std::to_string(returns.size()));
    }
    for (size_t index = 0; index < returns.size(); ++index) {
      stack->push_back(torch::jit::toIValue(items[index], returns[index].type()));
    }
  }

  py::handle on_gradient_;
};

void register_gradient_in_python(const std::string& op_name, py::object on_gradient) {
  auto autograd = std::make_unique<torch::Library>(torch::Library::IMPL, "attnres", c10::DispatchKey::Autograd,
                                                   __FILE__, __LINE__);
  autograd->impl(op_name.c_str(), torch::CppFunction::makeFromBoxedFunctor(
                                      std::make_unique<GradientInPythonKernel>(std::move(on_gradient))));
  EntryState& entry = state();
  std::lock_guard<std::mutex> lock(entry.mutex);
  entry.registrations.push_back(std::move(autograd));
}

// Registers the boxed EagerKernel as the CPU kernel of attnres::<op_name>.
void register_eager(const std::string& op_name) {
  EntryState& entry = state();
  if (!entry.first_call) throw std::runtime_error("attnres_ge._cpp_entry: install() first");
  const auto index = static_cast<int64_t>(entry.eager_ops.size());
  entry.eager_ops.push_back(op_name);
  auto cpu = std::make_unique<torch::Library>(torch::Library::IMPL, "attnres", c10::DispatchKey::CPU, __FILE__,
                                              __LINE__);
  cpu->impl(op_name.c_str(), torch::CppFunction::makeFromBoxedFunctor(std::make_unique<EagerKernel>(index)));
  entry.registrations.push_back(std::move(cpu));
}

void forget() {
  std::vector<std::shared_ptr<GraphNode>> nodes;
  {
    EntryState& entry = state();
    std::lock_guard<std::mutex> lock(entry.mutex);
    entry.eager_launches.clear();
    for (const auto& weak : entry.graph_nodes) {
      if (auto node = weak.lock()) nodes.push_back(std::move(node));
    }
  }
  for (const auto& node : nodes) node->forget();
}

size_t cached_launches() {
  EntryState& entry = state();
  std::lock_guard<std::mutex> lock(entry.mutex);
  return entry.eager_launches.size();
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.doc() = "The ops' C++ entry (private: used by attnres_ge.ge_plugin.op_common and local_ge)";
  // What Python checks before using this module: a build of other sources is not used.
  module.attr("INTERFACE_VERSION") = 8;
  module.def("install", &install, py::arg("first_call"), py::arg("max_signatures"), py::arg("output_pool_min_bytes"));
  module.def("empty_output", [](const std::vector<int64_t>& shape, at::ScalarType dtype) {
    return eager_output({shape, dtype});
  }, py::arg("shape"), py::arg("dtype"), "A fresh eager output: from the huge-page pool when large enough");
  module.def("use_output_pool", &use_output_pool, py::arg("pool"), py::arg("min_bytes"));
  py::class_<HugePagePool, std::shared_ptr<HugePagePool>>(module, "HugePagePool")
      .def(py::init<int64_t>(), py::arg("max_idle_bytes"))
      .def("empty", &HugePagePool::empty, py::arg("shape"), py::arg("dtype"))
      .def("idle_bytes", &HugePagePool::idle_bytes)
      .def("in_use_bytes", &HugePagePool::in_use_bytes)
      .def_property_readonly("mapped", &HugePagePool::mapped);
  module.def("register_eager", &register_eager, py::arg("op_name"));
  module.def("register_autograd", &register_autograd);
  module.def("register_gradient_in_python", &register_gradient_in_python, py::arg("op_name"),
             py::arg("on_gradient"));
  module.def("set_autograd_formulas", &set_autograd_formulas, py::arg("statistics_backward"),
             py::arg("differentiable_backward"));
  module.def("forget", &forget, "Drop every cached launch (eager and graph nodes)");
  module.def("cached_launches", &cached_launches, "How many eager input signatures have a cached launch");
  module.def("kept_workspace_allocations", [] { return g_kept_workspace_allocations.load(); },
             "How many workspaces cached eager calls allocated to keep (all threads, so far)");
  py::class_<GraphNode, std::shared_ptr<GraphNode>>(module, "GraphNode")
      .def(py::init(&make_graph_node), py::arg("input_order"), py::arg("result_order"),
           py::arg("plan"), py::arg("run"), py::arg("max_signatures"), py::arg("huge_page_min_bytes"))
      .def("__call__", &GraphNode::call)
      .def("planned_signatures", &GraphNode::planned_signatures)
      .def("allocations", &GraphNode::allocations);
}
