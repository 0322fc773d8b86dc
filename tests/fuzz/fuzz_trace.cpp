// Trace files (experiments/trace.h) as ditto-diverge compare reads two of them: each parsed, their
// configurations checked for a match, then walked for the first divergence. The input is two
// trace files separated by "\n--ditto-fuzz--\n".
#include "experiments/diverge.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto parts = fuzz::split(data, size, 2);
  const auto a = fuzz::scratch() / "a.trace", b = fuzz::scratch() / "b.trace";
  fuzz::write(a, parts[0]);
  fuzz::write(b, parts[1]);
  fuzz::expect_success_or_error([&] {
    const ditto::TraceComparison c = ditto::compare_trace_files(a.string(), b.string());
    ditto::format_comparison(c);
  });
  return 0;
}
