// Internal: a deterministic knob resolved through the context's tuning table (engine/tuning.h),
// for op families other than conv2d, whose selection path does this itself. With a table being
// read, the problem's entry decides (a missing entry, or one naming a variant that is not among
// the candidates, is a PolicyError naming the layer); while tuning, each candidate is timed
// (one warm-up call, then the median of three, on the context's stream) and the fastest is
// written down. Candidates are the knob's deterministic variants only, so a tuned run is as
// reproducible as an untuned deterministic one, and two runs reading one file choose alike.
#pragma once
#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "engine/context.h"
#include "engine/error.h"
#include "engine/timer.h"
#include "engine/tuning.h"

namespace ditto::detail {

template <class V>
V tuned_choice(Context& ctx, TuningEntry e, const std::vector<V>& candidates, const std::function<void(V)>& run,
               const std::string& where) {
  TuningTable& table = *ctx.tuning();
  std::string names;
  for (V v : candidates) names += fmt::format("{}{}", names.empty() ? "" : ", ", name_of(v));
  if (const TuningEntry* have = table.find(e.key())) {
    for (V v : candidates)
      if (have->algo == name_of(v)) return v;
    throw PolicyError(fmt::format("{}: tuning file {} names '{}' for this problem ({}), which is not one of its "
                                  "deterministic variants here: {}",
                                  where, table.path(), have->algo, e.key(), names));
  }
  if (table.reading())
    throw PolicyError(fmt::format("{}: tuning file {} has no entry for this problem ({}); tune again (run without the "
                                  "file) or add the entry",
                                  where, table.path(), e.key()));
  double best_ms = 0;
  const V* best = nullptr;
  std::string refused;
  for (const V& v : candidates) {
    try {
      IntervalTimer timer(ctx);
      for (int rep = 0; rep < 4; ++rep) {
        if (rep) timer.start();
        run(v);
        if (rep) timer.stop();
      }
      std::vector<double> ms = timer.milliseconds();
      std::sort(ms.begin(), ms.end());
      if (!best || ms[1] < best_ms) best = &v, best_ms = ms[1];
    } catch (const PolicyError& err) {  // a candidate this shape cannot run: not a choice
      refused += fmt::format("; {}: {}", name_of(v), err.what());
    }
  }
  if (!best) throw PolicyError(fmt::format("{}: no deterministic variant could run{}", where, refused));
  e.algo = name_of(*best);
  e.time_ms = best_ms;
  table.add(e);
  return *best;
}

}  // namespace ditto::detail
