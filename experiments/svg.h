// Self-contained SVG charts for experiment reports: plain text a browser opens directly, so a
// report needs no plotting library or runtime beyond fmt.
#pragma once
#include <string>
#include <vector>

namespace ditto {

// One bar: its value, an optional interval drawn as an error bar, and a note shown instead of an
// empty bar (e.g. "no divergence", "unsupported").
struct BarRow {
  std::string label;
  double value = 0, low = 0, high = 0;
  bool has_interval = false;
  std::string note;
};

// Horizontal bar chart: one row per bar (labels can be long, e.g. "layer2.0.conv1.bwd_filter=algo0"),
// bar length = value, a black error bar from low to high where has_interval, the value printed at the
// bar's end, and `note` (e.g. "no divergence", "unsupported") printed in grey instead of a bar when the
// value is 0 and note is non-empty. Title at top, x-axis label and 4-5 tick marks with values at the
// bottom. Width fixed (e.g. 900px), height grows with the number of rows. XML special characters in
// text are escaped. Values may be scaled by `scale` for display (e.g. 100 for percent). The axis
// starts at 0: throws Error for negative or non-finite values, interval ends or scale.
std::string svg_bar_chart(const std::string& title, const std::string& x_label, const std::vector<BarRow>& rows,
                          double scale = 1.0);

// The same chart on a log10 axis, for values that span decades (weight distances): ticks at
// each power of ten, bars from the lowest decade. Rows with value 0 show their note.
std::string svg_log_bar_chart(const std::string& title, const std::string& x_label, const std::vector<BarRow>& rows);

}  // namespace ditto
