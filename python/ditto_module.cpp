// ditto._ditto: the engine, the knob registry and training runs for Python (nanobind). The Python
// package (python/ditto/__init__.py) re-exports these and adds keyword flags and progress bars.
//
// Tensors cross by DLPack without copies: Context.from_dlpack wraps another library's array
// (engine/external.h), Tensor.__dlpack__ hands ditto's memory out. Errors are Python exceptions of
// the matching type (ditto.PolicyError for ditto::PolicyError, ...) with the same messages; a flag
// that ditto-train would refuse is refused the same way (ditto.FlagError), since train() parses
// ditto-train's own flags (experiments/cli.h).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <fmt/format.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/context.h"
#include "engine/detail/cuda_state.h"
#include "engine/error.h"
#include "engine/external.h"
#include "engine/knob.h"
#include "engine/manifest.h"
#include "engine/policy.h"
#include "datasets/augment.h"
#include "experiments/attribute_cli.h"
#include "experiments/cli.h"
#include "experiments/diverge_cli.h"
#include "experiments/experiment_cli.h"
#include "experiments/kernel_choices.h"
#include "experiments/report.h"
#include "experiments/run_dir.h"
#include "experiments/train.h"
#include "python/bridge.h"
#include "python/torch_ops.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace ditto {
using py::as_ndarray;
using py::from_dlpack;
namespace {

// Raised for a flag ditto-train refuses while parsing (CLI11's own checks and ditto's validators).
class FlagError : public Error {
 public:
  using Error::Error;
};

// ---- training runs --------------------------------------------------------------------------------

// A command line as the front ends' apply steps take it: `program` and then argv's words, which
// CLI11 has parsed into `app` (its refusals raised as FlagError).
struct CommandLine {
  std::vector<std::string> words;
  std::vector<char*> ptrs;
  CommandLine(CLI::App& app, const char* program, const std::vector<std::string>& argv) : words{program} {
    std::vector<std::string> args(argv.rbegin(), argv.rend());  // CLI11 takes them reversed
    try {
      app.parse(args);
    } catch (const CLI::ParseError& e) {
      throw FlagError(e.what());
    }
    words.insert(words.end(), argv.begin(), argv.end());
    for (auto& w : words) ptrs.push_back(w.data());
  }
  int argc() { return static_cast<int>(ptrs.size()); }
  char** argv() { return ptrs.data(); }
};

// ditto-train's flags, parsed as ditto-train parses them. argv excludes the program name.
TrainConfig parse_train_flags(const std::vector<std::string>& argv) {
  TrainConfig c;
  TrainFlags flags;
  CLI::App app{"ditto.train"};
  add_train_flags(app, c, flags);
  CommandLine line(app, "ditto.train", argv);
  apply_train_flags(c, flags, line.argc(), line.argv());
  return c;
}

std::string train_help() {
  TrainConfig c;
  TrainFlags flags;
  CLI::App app{"ditto.train: replayable training runs for determinism studies (ditto-train's flags)"};
  add_train_flags(app, c, flags);
  return app.help();
}

// A result vector as a numpy array that owns it (no copy).
template <class T>
nb::ndarray<nb::numpy, T> numpy_array(std::vector<T> v) {
  auto* held = new std::vector<T>(std::move(v));
  nb::capsule owner(held, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::ndarray<nb::numpy, T>(held->data(), {held->size()}, owner);
}

// One run: the result as a dict of Python values (the package wraps it in TrainResult).
nb::dict run_training(const std::vector<std::string>& argv, nb::object on_step) {
  TrainConfig c = parse_train_flags(argv);
  TrainHooks hooks;
  if (!on_step.is_none())
    hooks.after_step = [&on_step](const StepView& v) {
      nb::gil_scoped_acquire gil;
      on_step(v.step, v.epoch);
    };
  TrainResult r;
  {
    nb::gil_scoped_release released;  // the run's threads and the callback's reacquire are free
    r = train(c, hooks);
  }
  nb::dict d;
  // Per epoch, as the run folder's log.csv writes it (one spelling of the columns).
  d["log_csv"] = log_csv_text(r.log, r.task);
  d["seed_init"] = r.seed_init;
  d["seed_order"] = r.seed_order;
  d["seed_augment"] = r.seed_augment;
  d["weights_fingerprint"] = r.weights_fingerprint.hex();
  d["task"] = task_name(r.task);
  d["predictions"] = numpy_array(std::move(r.predictions));
  d["test_labels"] = numpy_array(std::move(r.test_labels));
  d["test_subgroups"] = numpy_array(std::move(r.test_subgroups));
  d["units_per_example"] = r.units_per_example;
  d["class_names"] = r.class_names;
  d["subgroup_names"] = r.subgroup_names;
  d["test_top1"] = r.test_top1;
  d["steps"] = r.steps;
  d["train_seconds"] = r.train_seconds;
  d["weights"] = numpy_array(std::move(r.weights));
  // The ops as the manifest writes them (one spelling of the fields); the package parses them.
  Manifest ops;
  for (const auto& e : r.ops) ops.record(e);
  d["ops_json"] = ops.to_json();
  d["warnings"] = r.warnings;
  d["out"] = c.out;
  d["replay"] = c.out.empty() ? std::string() : replay_line(c, r.seed_init, r.seed_order, r.seed_augment);
  return d;
}

// ditto-experiment's flags, parsed as ditto-experiment parses them, into `a` (argv without a
// program name).
void parse_experiment_flags(const std::vector<std::string>& argv, CLI::App& app, ExperimentArgs& a) {
  add_experiment_flags(app, a);
  CommandLine line(app, "ditto.experiment", argv);
  apply_experiment_flags(app, a, line.argc(), line.argv());
}

std::string experiment_help() {
  CLI::App app{"ditto.experiment: the paper's protocols (ditto-experiment's flags)"};
  ExperimentArgs a;
  add_experiment_flags(app, a);
  return app.help();
}

// One protocol run, its report written to --out as ditto-experiment writes it.
nb::dict run_experiment(const std::vector<std::string>& argv, nb::object on_replica) {
  CLI::App app{"ditto.experiment"};
  ExperimentArgs a;
  parse_experiment_flags(argv, app, a);
  // With a progress callback it reports the replicas; ditto-experiment's own lines stay off.
  if (!on_replica.is_none()) a.o.verbose = false;
  if (!on_replica.is_none())
    a.o.on_replica = [&on_replica](const std::string& setting, int replica, int done, int total) {
      nb::gil_scoped_acquire gil;
      try {
        on_replica(setting, replica, done, total);
      } catch (nb::python_error& e) {  // a worker thread cannot hand it on: reported, not lost
        e.discard_as_unraisable("ditto.experiment's progress callback");
      }
    };
  ReportData report;
  double wall = 0;
  {
    nb::gil_scoped_release released;
    auto data = load_train_data(a.o.base);
    report = run_experiment_protocol(a, data, &wall);
    write_report(a.o.out, report);
  }
  nb::dict d;
  d["out"] = a.o.out;
  d["protocol"] = a.protocol;
  d["wall_seconds"] = wall;
  d["control_mismatch"] = control_mismatch(report, a.protocol);
  return d;
}

std::string attribute_help() {
  CLI::App app{"ditto.attribute: attribute run-to-run churn to single kernels (ditto-attribute's flags)"};
  AttributeArgs a;
  add_attribute_flags(app, a);
  return app.help();
}

// The attribution ditto-attribute runs, each form written to out/<form>: the forms' folders and the
// baseline check. With list=True only the candidates' names.
nb::dict run_attribution(const std::vector<std::string>& argv) {
  CLI::App app{"ditto.attribute"};
  AttributeArgs a;
  add_attribute_flags(app, a);
  CommandLine line(app, "ditto.attribute", argv);
  if (!a.report.empty()) throw FlagError("--report: ditto.attribute runs attributions; read an earlier one's "
                                         "attribution.json with json.load");
  apply_train_flags(a.base, a.flags, line.argc(), line.argv());
  a.base.checkpoint = !a.no_checkpoint;
  const std::vector<Candidate> cands = chosen_candidates(a);
  nb::dict d;
  std::vector<std::string> names;
  for (const auto& c : cands) names.push_back(c.name);
  d["candidates"] = names;
  std::vector<std::string> folders;
  std::string mismatch;
  if (!a.list) {
    a.opts.out = a.out;
    nb::gil_scoped_release released;
    for (AttributionForm f : chosen_forms(a)) {
      a.opts.form = f;
      const AttributionResult r = attribute(a.base, candidates_for(cands, f), a.opts);
      const std::string dir = a.out + "/" + form_name(f);
      write_attribution(r, dir);
      folders.push_back(dir);
      mismatch = baseline_mismatch(r);
      if (!mismatch.empty()) break;
    }
  }
  d["folders"] = folders;
  d["baseline_mismatch"] = mismatch;
  return d;
}

std::string diverge_help() {
  CLI::App app{"ditto.diverge: where two runs of one configuration part (ditto-diverge run's flags)"};
  DivergeArgs a;
  add_diverge_subcommands(app, a);
  return a.run->help();
}

// A first divergence as Python values.
nb::dict divergence_dict(const Divergence& d) {
  nb::dict out;
  out["found"] = d.found;
  out["structure_mismatch"] = d.structure_mismatch;
  out["tensor"] = d.tensor;
  out["note"] = d.note;
  out["events_compared"] = d.events_compared;
  return out;
}

// ditto-diverge run: the two runs in lockstep, compared op by op; diverge.json and growth.csv in
// --out.
nb::dict run_divergence(const std::vector<std::string>& argv) {
  CLI::App app{"ditto.diverge"};
  DivergeArgs a;
  add_diverge_subcommands(app, a);
  std::vector<std::string> words{"run"};
  words.insert(words.end(), argv.begin(), argv.end());
  CommandLine line(app, "ditto.diverge", words);
  if (a.measure_overhead) throw FlagError("--measure-overhead: ditto-diverge's own report; time ditto.train instead");
  apply_train_flags(a.cfg, a.flags, line.argc(), line.argv());
  a.cfg.out = a.out;
  DivergeResult r;
  {
    nb::gil_scoped_release released;
    r = diverge(a.cfg, a.opts);
    write_divergence(r, a.out);
  }
  nb::dict d;
  d["out"] = a.out;
  d["first"] = divergence_dict(r.first);
  d["source"] = divergence_dict(r.source);
  d["text"] = format_divergence(r);
  return d;
}

// ditto-diverge compare: two trace files.
nb::dict compare_traces(const std::string& a, const std::string& b) {
  TraceComparison c;
  {
    nb::gil_scoped_release released;
    c = compare_trace_files(a, b);
  }
  nb::dict d;
  d["first"] = divergence_dict(c.first);
  d["source"] = divergence_dict(c.source);
  d["text"] = format_comparison(c);
  return d;
}

// ditto-diverge kernels: the kernels two runs chose, side by side.
nb::dict compare_kernels(const std::string& a, const std::string& b) {
  KernelChoices c;
  {
    nb::gil_scoped_release released;
    c = compare_kernel_choices(a, b);
  }
  auto entry = [](const std::optional<ManifestEntry>& e) -> nb::object {
    if (!e) return nb::none();
    nb::dict d;
    d["variant"] = e->variant;
    d["algorithm"] = e->algorithm;
    d["precision"] = e->precision;
    d["guarantee"] = guarantee_name(e->guarantee);
    d["requested"] = e->requested;
    return d;
  };
  nb::list runtime, differing;
  for (const auto& [field, va, vb] : c.runtime) runtime.append(nb::make_tuple(field, va, vb));
  for (const KernelChoice& k : c.differing) {
    nb::dict d;
    d["layer"] = k.layer;
    d["op"] = k.op;
    d["knob"] = k.knob;
    d["shape"] = k.shape;
    d["a"] = entry(k.a);
    d["b"] = entry(k.b);
    differing.append(d);
  }
  nb::dict d;
  d["manifest_a"] = c.manifest_a;
  d["manifest_b"] = c.manifest_b;
  d["runtime"] = runtime;
  d["differing"] = differing;
  d["same"] = c.same;
  d["text"] = format_kernel_choices(c);
  return d;
}

}  // namespace
}  // namespace ditto

NB_MODULE(_ditto, m) {
  using namespace ditto;
  m.doc() = "ditto's engine, knob registry and training runs (the package `ditto` re-exports them)";

  // Most specific last: nanobind tries the latest registered translator first.
  static nb::exception<Error> error(m, "Error", PyExc_RuntimeError);
  static nb::exception<CudaError> cuda_error(m, "CudaError", error.ptr());
  static nb::exception<CudnnError> cudnn_error(m, "CudnnError", error.ptr());
  static nb::exception<CublasError> cublas_error(m, "CublasError", error.ptr());
  static nb::exception<ShapeError> shape_error(m, "ShapeError", error.ptr());
  static nb::exception<PolicyError> policy_error(m, "PolicyError", error.ptr());
  static nb::exception<DataError> data_error(m, "DataError", error.ptr());
  static nb::exception<IoError> io_error(m, "IoError", error.ptr());
  static nb::exception<FlagError> flag_error(m, "FlagError", error.ptr());

  m.def(
      "knobs",
      [] {
        nb::list out;
        for (const KnobSpec& k : ditto::knobs()) {
          nb::list variants;
          for (const VariantSpec& v : k.variants) {
            nb::dict vd;
            vd["name"] = v.name;
            vd["guarantee"] = guarantee_name(v.guarantee);
            vd["impl"] = v.impl == Impl::Ditto ? "ditto" : v.impl == Impl::Library ? "library" : "cpu-reference";
            vd["summary"] = v.summary;
            vd["by_name_only"] = v.by_name_only;  // no mode picks it: a rule names it
            variants.append(vd);
          }
          nb::dict kd;
          kd["op"] = op_kind_name(k.op);
          kd["knob"] = k.name;
          kd["variants"] = variants;
          kd["framework_default"] = k.framework_default;
          // What the pytorch mode picks: PyTorch 2.11's default where it is another variant.
          kd["pytorch_default"] = k.pytorch_default.empty() ? k.framework_default : k.pytorch_default;
          kd["selected_at_run_time"] = k.selected_at_run_time;
          kd["summary"] = k.summary;
          out.append(kd);
        }
        return out;
      },
      "Every knob of every op family: its variants with their guarantees, and the framework default.");

  nb::class_<Policy>(m, "Policy", "Rules LAYER.KNOB=VARIANT or LAYER.KNOB=MODE (engine/policy.h)")
      .def("__init__", [](Policy* p, const std::vector<std::string>& rules) { new (p) Policy(Policy::parse(rules)); },
           "rules"_a = std::vector<std::string>{}, "Parses the rules; a bad one raises PolicyError naming it.")
      .def_prop_ro("rules", [](const Policy& p) { return p.rules(); })
      .def("__repr__", [](const Policy& p) {
        std::string s = "ditto.Policy([";
        for (std::size_t i = 0; i < p.rules().size(); ++i) s += (i ? ", '" : "'") + p.rules()[i] + "'";
        return s + "])";
      });

  nb::class_<Tensor>(m, "Tensor", "A ditto tensor; shares memory with NumPy, PyTorch, CuPy and JAX through DLPack")
      .def_prop_ro("shape", [](const Tensor& t) { return t.shape(); })
      .def_prop_ro("dtype", [](const Tensor& t) { return std::string(dtype_name(t.dtype())); })
      .def_prop_ro("device", [](const Tensor& t) { return t.device().str(); })
      .def("fingerprint", [](const Tensor& t) { return t.fingerprint().hex(); },
           "XXH3-128 of dtype, shape and bytes, as hex: equal on CPU and GPU for equal bits.")
      .def(
          "__dlpack__",
          [](const Tensor& t, nb::kwargs kwargs) { return nb::cast(as_ndarray(t)).attr("__dlpack__")(**kwargs); },
          "The tensor's memory as a DLPack capsule (no copy; a CUDA tensor's pending work ends first).")
      .def("__dlpack_device__", [](const Tensor& t) { return nb::cast(as_ndarray(t)).attr("__dlpack_device__")(); })
      .def("__repr__", [](const Tensor& t) {
        return fmt::format("ditto.Tensor(shape={}, dtype={}, device={})", shape_str(t.shape()), dtype_name(t.dtype()),
                           t.device().str());
      });

  nb::class_<Context>(m, "Context", "A device, its policy, its stream and memory arena (engine/context.h)")
      .def("__init__",
           [](Context* c, const std::string& device, const Policy& policy) {
             new (c) Context(Device::parse(device), policy);
           },
           "device"_a = "cpu", "policy"_a = Policy())
      .def_prop_ro("device", [](const Context& c) { return c.device().str(); })
      .def("from_dlpack", &from_dlpack, "array"_a,
           "A ditto tensor sharing the array's memory (C-contiguous float32, int32, bfloat16 or float16 on this "
           "context's device); a GPU producer is asked for its data on this context's stream.")
      .def("synchronize", &Context::synchronize, "Waits for the work queued on the context's stream.")
      .def(
          "runtime_info",
          [](const Context& c) {
            const RuntimeInfo i = c.runtime_info();
            nb::dict d;
            d["device"] = i.device, d["gpu_name"] = i.gpu_name, d["driver"] = i.driver;
            d["cuda_runtime"] = i.cuda_runtime, d["cudnn"] = i.cudnn, d["cudnn_build"] = i.cudnn_build;
            d["cublas"] = i.cublas, d["git_commit"] = i.git_commit;
            return d;
          },
          "What a run manifest records of the build and the machine: device, gpu_name and driver (empty on "
          "the CPU), the CUDA runtime, cuDNN (loaded and built against) and cuBLAS versions, and git_commit "
          "(the source ditto was built from).");

  m.def(
      "epoch_permutation",
      [](int64_t n, uint64_t seed_order, int epoch) {
        if (n < 0) throw ShapeError(fmt::format("epoch_permutation: n = {}: a dataset has 0 or more examples", n));
        if (epoch < 0) throw ShapeError(fmt::format("epoch_permutation: epoch = {}: epochs count from 0", epoch));
        return epoch_permutation(n, seed_order, epoch);
      },
      "n"_a, "seed_order"_a, "epoch"_a,
      "The example order ditto's loader draws for `n` training examples under --seed-order `seed_order` in "
      "epoch `epoch`, counted from 0 (ditto-train's epoch e reads epoch e - 1); its batches are consecutive "
      "slices. A peer in another framework that reads its data in this order sees ditto's batches.");
  m.def("train_help", &train_help, "ditto-train's --help: the flags train() takes.");
  m.def("attribute_help", &attribute_help, "ditto-attribute's --help: the flags attribute() takes.");
  m.def("_run_attribution", &run_attribution, "argv"_a,
        "Runs ditto-attribute's attribution (argv without a program name); each form written to --out/<form>.");
  m.def("diverge_help", &diverge_help, "ditto-diverge run's --help: the flags diverge() takes.");
  m.def("_run_divergence", &run_divergence, "argv"_a,
        "ditto-diverge run (argv without the program and subcommand); diverge.json written to --out.");
  m.def("compare_traces", &compare_traces, "trace_a"_a, "trace_b"_a,
        "ditto-diverge compare: where two trace files (ditto-diverge record) first part, as a dict.");
  m.def("compare_kernels", &compare_kernels, "run_a"_a, "run_b"_a,
        "ditto-diverge kernels: the kernels two runs chose (run folders or manifest.json files), as a dict: "
        "'runtime' (field, a, b) where GPU, driver or libraries differ, 'differing' (layer, op, knob, shape, a, b; "
        "a or b None where that run recorded no such entry), 'same' (entries that ran the same kernel) and 'text'.");
  m.def("experiment_help", &experiment_help, "ditto-experiment's --help: the flags experiment() takes.");
  m.def("_run_experiment", &run_experiment, "argv"_a, "on_replica"_a = nb::none(),
        "Runs a protocol with ditto-experiment's flags (argv without a program name); writes the report to --out.");
  py::bind_torch_ops(m);
  m.def("_run_training", &run_training, "argv"_a, "on_step"_a = nb::none(),
        "Trains with ditto-train's flags (argv without a program name); a dict of the results.");
}
