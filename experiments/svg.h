// Self-contained SVG charts for experiment reports: plain text a browser opens directly, so a
// report needs no plotting library or runtime beyond fmt. Every chart's root element carries
// class="chart": a report page finds its charts by that class to check that each drew something.
#pragma once
#include <cstddef>
#include <optional>
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
// each power of ten, bars from the lowest decade. Rows with value 0 show their note. Interval
// ends above 0 widen the decades shown; an end at 0 is drawn at the axis' start. Throws Error
// for negative or non-finite values or interval ends.
std::string svg_log_bar_chart(const std::string& title, const std::string& x_label, const std::vector<BarRow>& rows);

// Escapes the five XML special characters (& < > " ') so that any text, such as a subgroup
// named "Blond_Hair=1 & Male=0", can be placed in SVG or HTML text and attribute values.
std::string xml_escape(const std::string& text);

// The i-th colour of the palette every chart uses (Tableau 10, cycling), so that a report can
// give one setting the same colour in all its charts.
std::string chart_color(std::size_t i);

// One line of a line chart: y over x, and optionally a shaded band from band_low to band_high
// (e.g. the lowest and highest replica around their mean). band_low and band_high are either
// both empty or hold one value per point. An empty colour takes chart_color(series index).
struct LineSeries {
  std::string name;
  std::vector<double> x, y;
  std::vector<double> band_low, band_high;
  std::string color;
};

// Line chart: each series as a line through its points (in the order given) with a dot at each
// point, its band shaded underneath, a legend naming the series below the axes. Linear y axis
// with 4-6 round ticks spanning every y and band value; the x axis is linear, or with log_x
// (learning rates) log10 with a tick at each power of ten. Throws Error for non-finite values,
// x <= 0 on a log axis, or series whose vectors differ in length.
std::string svg_line_chart(const std::string& title, const std::string& x_label, const std::string& y_label,
                           const std::vector<LineSeries>& series, bool log_x = false);

// One series of a grouped bar chart: a value per group, std::nullopt where this series has no
// value for that group (drawn as "n/a", not as a zero bar). An empty colour takes
// chart_color(series index).
struct BarSeries {
  std::string name;
  std::vector<std::optional<double>> values;  // one per group
  std::string color;
};

// Horizontal grouped bar chart: one block of rows per group label (e.g. a class or a subgroup
// cell), one thin bar per series inside it (e.g. a setting), the value printed at each bar's end,
// a legend below. The axis starts at 0: throws Error for negative or non-finite values, or a
// series whose value count differs from the number of groups.
std::string svg_grouped_bar_chart(const std::string& title, const std::string& x_label,
                                  const std::vector<std::string>& groups, const std::vector<BarSeries>& series);

// One bin of a histogram: its label under the bar and its count.
struct HistogramBin {
  std::string label;
  double count = 0;
};

// Vertical histogram: one bar per bin in the order given, bin labels under the bars, counts
// printed above them where there is room, a y axis from 0 with round ticks. Throws Error for
// negative or non-finite counts.
std::string svg_histogram(const std::string& title, const std::string& x_label, const std::string& y_label,
                          const std::vector<HistogramBin>& bins);

// A heat map: one row per label (top to bottom), one column per x value, each cell coloured by
// log10 of its value between the smallest and largest positive values present (white: no value or
// zero; a colour bar with the range below). For quantities spanning many decades, such as the
// distance between two runs as it grows from the first differing bit. rows[r][c] belongs to
// row_labels[r] and columns[c]; std::nullopt draws nothing. Throws Error for negative or
// non-finite values, or rows whose length differs from columns'.
std::string svg_heat_map(const std::string& title, const std::string& x_label, const std::vector<std::string>& row_labels,
                         const std::vector<double>& columns, const std::vector<std::vector<std::optional<double>>>& rows);

}  // namespace ditto
