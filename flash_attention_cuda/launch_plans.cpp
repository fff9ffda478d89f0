// Launch plans in C++: a call's allocations and kernel launches without Python in between.
//
// flash_attn_cuda's Python path spends 50-80 us of host time on a call whose kernels run a few microseconds
// (docs/performance.md, "Host time"): the checks, torch.empty twice, the stream lookup, argument packing and
// cuLaunchKernel through ctypes. After the first call of a given shape, launch_plans.py registers here what that
// call did -- its outputs' shapes and dtypes and, per launch, the kernel, grid, block, shared memory and where each
// parameter comes from -- and a later call with the same key runs it in one C++ call:
//
//   run(plan, [q, k, v])  ->  (O, lse)            (the forward; the backward: [q, k, v, o, lse, dO] -> dQ, dK, dV)
//
// A call that needs gradients runs the same plans inside a C++ autograd function (PlannedAttention): the forward's
// plan, then in the backward, on autograd's device thread and without the GIL, the backward's plan once
// launch_plans.py has registered one in the call's slot; until then (and with create_graph) the slot's Python
// callable runs the backward.
//
// flash_attention_triton/launch_plans.py registers flash_attn_triton's launches here too: a Triton kernel is a
// CUfunction whose parameters are its pointers, then its scalars, as the description lists them.
//
// The plan never checks an input's values or types: Python did, before it registered the plan, and keys it on
// every property those checks read. What run does check is what the key leaves out: each input contiguous on the
// plan's device (the current one), and 16 bytes aligned where the plan needs it. Otherwise it returns None and the
// caller takes the Python path. No CUDA header is needed: the two driver entry points (cuLaunchKernel and
// cuTensorMapEncodeTiled) are passed in as addresses by launch_plans.py, which found them with ctypes.
#include <torch/extension.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace {

// cuda.h's signatures, with its handles as void*
using LaunchFn = int (*)(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                         unsigned smem, void* stream, void** params, void** extra);
using EncodeFn = int (*)(void* map, int dtype, uint32_t rank, void* address, const uint64_t* dims,
                         const uint64_t* byte_strides, const uint32_t* box, const uint32_t* elem_strides,
                         int interleave, int swizzle, int l2_promotion, int oob_fill);

struct MapArg {          // a TMA descriptor of a buffer, encoded at each call (it holds the address)
  int src;               // which buffer: an input, then the outputs in order
  uint64_t dims[3];      // innermost first (runtime.tensor_map_layout)
  uint64_t strides[2];   // bytes
  uint32_t box[3];
  int swizzle;
};

struct BufArg {          // a pointer parameter: buffer src's address + offset bytes
  int src;
  int64_t offset;
};

struct Launch {
  void* function;        // CUfunction
  unsigned dims[6];      // grid x y z, block x y z
  unsigned smem;
  std::vector<MapArg> maps;
  std::vector<BufArg> buffers;
  std::vector<uint8_t> scalars;          // the scalar parameters' C values, back to back
  std::vector<size_t> scalar_offsets;    // where each starts in `scalars`
};

struct Output {
  std::vector<int64_t> shape;
  at::ScalarType dtype;
};

struct Plan {
  int device;
  size_t n_inputs;
  std::vector<std::vector<int64_t>> input_shapes;  // per input: the shape the plan was made for
  std::vector<uint8_t> aligned16;        // per input: its address must be a multiple of 16 bytes
  std::vector<Output> outputs;
  std::vector<Launch> launches;
  std::vector<int> returned;             // which outputs run() returns, in order
};

// Plans and slots are added under the GIL and read by backwards on autograd's thread without it: a mutex guards
// the two tables, and a plan, once added, never changes.
std::mutex g_mutex;
std::vector<std::shared_ptr<const Plan>> g_plans;

struct Slot {                            // the backward of one autograd key
  std::atomic<int64_t> plan{-1};         // its plan, once registered
  py::object* fallback;                  // (q, k, v, o, lse, dO) -> (dQ, dK, dV) on the Python path (never freed)
};
std::vector<std::unique_ptr<Slot>> g_slots;

LaunchFn g_launch = nullptr;
EncodeFn g_encode = nullptr;

// cuda.h: CU_TENSOR_MAP_DATA_TYPE_UINT16, _INTERLEAVE_NONE, _L2_PROMOTION_L2_256B, _FLOAT_OOB_FILL_NONE (zeros)
constexpr int kTmaUint16 = 1, kTmaInterleaveNone = 0, kTmaL2_256B = 3, kTmaOobZero = 0;

void set_driver(int64_t launch, int64_t encode) {
  g_launch = reinterpret_cast<LaunchFn>(launch);
  g_encode = reinterpret_cast<EncodeFn>(encode);
}

// A plan from launch_plans.py's description; returns its id.
//   input_shapes: [shape, ...]; outputs: [(shape, dtype), ...];
//   launches: [(function, dims6, smem, maps, buffers, scalars), ...] with
//   maps [(src, dims3, strides2, box3, swizzle)], buffers [(src, offset)], scalars [bytes, ...]
int64_t add_plan(int64_t device, const std::vector<bool>& aligned16,
                 const std::vector<std::vector<int64_t>>& input_shapes, py::list outputs, py::list launches,
                 const std::vector<int64_t>& returned) {
  TORCH_CHECK(input_shapes.size() == aligned16.size(), "launch_plans.add_plan: one shape per input");
  Plan plan;
  plan.device = static_cast<int>(device);
  plan.n_inputs = aligned16.size();
  plan.input_shapes = input_shapes;
  for (bool a : aligned16) plan.aligned16.push_back(a ? 1 : 0);
  for (auto item : outputs) {
    auto t = item.cast<py::tuple>();
    plan.outputs.push_back({t[0].cast<std::vector<int64_t>>(), t[1].cast<at::ScalarType>()});
  }
  for (auto item : launches) {
    auto t = item.cast<py::tuple>();
    Launch l;
    l.function = reinterpret_cast<void*>(t[0].cast<int64_t>());
    auto dims = t[1].cast<std::vector<int64_t>>();
    TORCH_CHECK(dims.size() == 6, "launch_plans.add_plan: dims must hold 6 values");
    for (int i = 0; i < 6; ++i) l.dims[i] = static_cast<unsigned>(dims[i]);
    l.smem = t[2].cast<unsigned>();
    for (auto m : t[3].cast<py::list>()) {
      auto mt = m.cast<py::tuple>();
      MapArg a{};
      a.src = mt[0].cast<int>();
      auto d = mt[1].cast<std::vector<uint64_t>>(), s = mt[2].cast<std::vector<uint64_t>>();
      auto b = mt[3].cast<std::vector<uint32_t>>();
      TORCH_CHECK(d.size() == 3 && s.size() == 2 && b.size() == 3, "launch_plans.add_plan: a map is 3-d");
      std::copy(d.begin(), d.end(), a.dims);
      std::copy(s.begin(), s.end(), a.strides);
      std::copy(b.begin(), b.end(), a.box);
      a.swizzle = mt[4].cast<int>();
      l.maps.push_back(a);
    }
    for (auto b : t[4].cast<py::list>()) {
      auto bt = b.cast<py::tuple>();
      l.buffers.push_back({bt[0].cast<int>(), bt[1].cast<int64_t>()});
    }
    for (auto s : t[5].cast<py::list>()) {
      std::string bytes = s.cast<py::bytes>();
      l.scalar_offsets.push_back(l.scalars.size());
      l.scalars.insert(l.scalars.end(), bytes.begin(), bytes.end());
    }
    plan.launches.push_back(std::move(l));
  }
  for (int64_t r : returned) plan.returned.push_back(static_cast<int>(r));
  std::lock_guard<std::mutex> lock(g_mutex);
  g_plans.push_back(std::make_shared<const Plan>(std::move(plan)));
  return static_cast<int64_t>(g_plans.size()) - 1;
}

std::shared_ptr<const Plan> plan_of(int64_t id) {
  std::lock_guard<std::mutex> lock(g_mutex);
  TORCH_CHECK(id >= 0 && id < static_cast<int64_t>(g_plans.size()), "launch_plans: no plan ", id);
  return g_plans[id];
}

Slot* slot_of(int64_t id) {
  std::lock_guard<std::mutex> lock(g_mutex);
  TORCH_CHECK(id >= 0 && id < static_cast<int64_t>(g_slots.size()), "launch_plans: no slot ", id);
  return g_slots[id].get();
}

// Whether `inputs` fit `plan`: as many as it takes, each of the shape it was made for, contiguous on its device
// (the current one), 16 bytes aligned where it needs that.
bool fits(const Plan& plan, const std::vector<at::Tensor>& inputs) {
  if (inputs.size() != plan.n_inputs || c10::cuda::current_device() != plan.device) return false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor& x = inputs[i];
    if (!x.defined() || !x.is_cuda() || x.get_device() != plan.device || !x.is_contiguous() || x.is_neg()) return false;
    if (!x.sizes().equals(plan.input_shapes[i])) return false;
    if (plan.aligned16[i] && reinterpret_cast<uint64_t>(x.data_ptr()) % 16 != 0) return false;
  }
  return true;
}

// Run `plan` on `inputs` (which fit it): allocate its outputs, launch its kernels on torch's current stream, and
// return the outputs it names. Touches no Python object.
std::vector<at::Tensor> launch(const Plan& plan, const std::vector<at::Tensor>& inputs) {
  std::vector<uint64_t> address;
  address.reserve(plan.n_inputs + plan.outputs.size());
  for (const at::Tensor& x : inputs) address.push_back(reinterpret_cast<uint64_t>(x.data_ptr()));
  std::vector<at::Tensor> outs;
  outs.reserve(plan.outputs.size());
  for (const Output& o : plan.outputs) {
    outs.push_back(at::empty(o.shape, at::TensorOptions().dtype(o.dtype).device(at::kCUDA, plan.device)));
    address.push_back(reinterpret_cast<uint64_t>(outs.back().data_ptr()));
  }
  void* stream = c10::cuda::getCurrentCUDAStream(plan.device).stream();
  for (const Launch& l : plan.launches) {
    // kernelParams: the maps (128 bytes each, 64-byte aligned), then the buffers' addresses, then the scalars
    alignas(64) uint8_t maps[4][128];
    uint64_t buffers[16];
    void* params[32];
    TORCH_CHECK(l.maps.size() <= 4 && l.buffers.size() <= 16 &&
                    l.maps.size() + l.buffers.size() + l.scalar_offsets.size() <= 32,
                "launch_plans.run: too many kernel parameters");
    size_t n = 0;
    for (size_t i = 0; i < l.maps.size(); ++i) {
      const MapArg& m = l.maps[i];
      const uint32_t ones[3] = {1, 1, 1};
      int err = g_encode(maps[i], kTmaUint16, 3, reinterpret_cast<void*>(address[m.src]), m.dims, m.strides, m.box,
                         ones, kTmaInterleaveNone, m.swizzle, kTmaL2_256B, kTmaOobZero);
      TORCH_CHECK(err == 0, "launch_plans.run: cuTensorMapEncodeTiled failed with CUresult ", err);
      params[n++] = maps[i];
    }
    for (size_t i = 0; i < l.buffers.size(); ++i) {
      buffers[i] = address[l.buffers[i].src] + l.buffers[i].offset;
      params[n++] = &buffers[i];
    }
    for (size_t off : l.scalar_offsets) params[n++] = const_cast<uint8_t*>(l.scalars.data() + off);
    int err = g_launch(l.function, l.dims[0], l.dims[1], l.dims[2], l.dims[3], l.dims[4], l.dims[5], l.smem, stream,
                       params, nullptr);
    TORCH_CHECK(err == 0, "launch_plans.run: cuLaunchKernel failed with CUresult ", err);
  }
  std::vector<at::Tensor> result;
  for (int r : plan.returned) result.push_back(outs[r]);
  return result;
}

// Run plan `id` on `inputs` -> a tuple of the outputs it names, or None where the inputs do not fit it (the caller
// goes the Python way).
py::object run(int64_t id, const std::vector<at::Tensor>& inputs) {
  auto plan = plan_of(id);
  if (!fits(*plan, inputs)) return py::none();
  auto out = launch(*plan, inputs);
  py::tuple result(out.size());
  for (size_t i = 0; i < out.size(); ++i) result[i] = py::cast(out[i]);
  return result;
}

int64_t add_slot(py::object fallback) {
  auto slot = std::make_unique<Slot>();
  slot->fallback = new py::object(std::move(fallback));
  std::lock_guard<std::mutex> lock(g_mutex);
  g_slots.push_back(std::move(slot));
  return static_cast<int64_t>(g_slots.size()) - 1;
}

void set_slot(int64_t id, int64_t plan) { slot_of(id)->plan.store(plan); }

// O, lse = attention(q, k, v) through the forward's plan, differentiable: the backward runs the slot's plan, or
// (none yet, create_graph, inputs that do not fit) the slot's Python callable.
struct PlannedAttention : public torch::autograd::Function<PlannedAttention> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q,
                                                const at::Tensor& k, const at::Tensor& v, int64_t plan,
                                                int64_t slot) {
    auto out = launch(*plan_of(plan), {q, k, v});  // O, lse
    ctx->save_for_backward({q, k, v, out[0], out[1]});
    ctx->saved_data["slot"] = slot;
    ctx->mark_non_differentiable({out[1]});
    ctx->set_materialize_grads(false);
    return {out[0], out[1]};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    at::Tensor q = saved[0], k = saved[1], v = saved[2], o = saved[3], lse = saved[4];
    at::Tensor d_o = grads[0];
    if (!d_o.defined()) d_o = at::zeros_like(o);  // O was not used by the loss
    if (d_o.scalar_type() != q.scalar_type()) d_o = d_o.to(q.scalar_type());
    d_o = d_o.contiguous();  // e.g. the expanded ones of loss = O.sum()
    Slot* slot = slot_of(ctx->saved_data["slot"].toInt());
    std::vector<at::Tensor> inputs{q, k, v, o, lse, d_o};
    int64_t id = slot->plan.load();
    if (id >= 0 && !at::GradMode::is_enabled()) {
      auto plan = plan_of(id);
      if (fits(*plan, inputs)) {
        auto g = launch(*plan, inputs);
        return {g[0], g[1], g[2], at::Tensor(), at::Tensor()};
      }
    }
    py::gil_scoped_acquire gil;
    py::tuple g = (*slot->fallback)(q, k, v, o, lse, d_o);
    return {g[0].cast<at::Tensor>(), g[1].cast<at::Tensor>(), g[2].cast<at::Tensor>(), at::Tensor(), at::Tensor()};
  }
};

// The forward of a call that needs gradients -> (O, lse) with PlannedAttention as O's grad_fn, or None where the
// inputs do not fit the plan.
py::object run_autograd(int64_t plan, int64_t slot, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  if (!fits(*plan_of(plan), {q, k, v})) return py::none();
  auto out = PlannedAttention::apply(q, k, v, plan, slot);
  return py::make_tuple(out[0], out[1]);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "flash_attention_cuda's launch plans: a call's allocations and launches in C++ (launch_plans.py)";
  m.def("set_driver", &set_driver, "the addresses of cuLaunchKernel and cuTensorMapEncodeTiled");
  m.def("add_plan", &add_plan, "register a launch plan; returns its id");
  m.def("run", &run, "run a plan on its inputs -> its outputs, or None where they do not fit it");
  m.def("add_slot", &add_slot, "a backward slot with its Python fallback; returns its id");
  m.def("set_slot", &set_slot, "the backward plan of a slot");
  m.def("run_autograd", &run_autograd, "the forward plan as a differentiable call -> (O, lse), or None");
  m.def("count", [] { return g_plans.size(); }, "how many plans are registered");
}
