#include "experiments/svg.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <utility>

#include "engine/error.h"

namespace ditto {

namespace {

constexpr double kWidth = 900, kTitleHeight = 40, kRowHeight = 22, kAxisHeight = 56;
constexpr double kValueMargin = 80;   // room right of the longest bar for its printed value
constexpr double kCharWidth = 7.3;    // 12px monospace advance, to size the label column
constexpr double kLegendRow = 18;     // one legend entry per line: names can be long
constexpr double kPlotHeight = 300;   // line chart and histogram plot area

// Smallest step from {1, 2, 2.5, 5, 10} x 10^k that covers axis_max in at most four steps; as each
// candidate is at most twice the previous, it also takes at least three, so 4-5 ticks with 0.
double tick_step(double axis_max) {
  const double raw = axis_max / 4;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  for (double nice : {1.0, 2.0, 2.5, 5.0})
    if (nice * magnitude >= raw * (1 - 1e-9)) return nice * magnitude;
  return 10 * magnitude;
}

// Tick label of a multiple of step: values within rounding error of 0 print as "0", not "-1e-17".
std::string tick_label(double v, double step) { return fmt::format("{:g}", std::abs(v) < step * 1e-9 ? 0.0 : v); }

// A linear axis of round ticks covering [lo, hi]: first and last tick, step between them.
struct LinearAxis {
  double first = 0, last = 1, step = 1;
  double pos(double v) const { return (v - first) / (last - first); }
};

// integer_only: for epochs, where a tick at 2.5 would name no data point.
LinearAxis linear_axis(double lo, double hi, bool integer_only = false) {
  if (!(hi > lo)) {  // one value (or none): centre it on an axis of some width
    const double pad = integer_only ? 1.0 : (hi != 0 ? std::abs(hi) * 0.05 : 0.5);
    lo -= pad;
    hi += pad;
  }
  double step = tick_step(hi - lo);
  if (integer_only) step = step < 1 ? 1 : (step == 2.5 ? 2 : step);
  LinearAxis axis;
  axis.step = step;
  axis.first = std::floor(lo / step + 1e-9) * step;
  axis.last = std::ceil(hi / step - 1e-9) * step;
  if (axis.last <= axis.first) axis.last = axis.first + step;
  return axis;
}

std::string svg_open(double width, double height, const std::string& title) {
  return fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" width=\"{0}\" height=\"{1}\" "
      "viewBox=\"0 0 {0} {1}\" font-family=\"monospace\" font-size=\"12\" style=\"background:white\">\n"
      "<text x=\"{2}\" y=\"24\" text-anchor=\"middle\" font-size=\"15\" font-weight=\"bold\">{3}</text>\n",
      width, height, width / 2, xml_escape(title));
}

// The legend below a chart: a colour sample and the series name, one entry per line.
std::string legend(double top, double left, const std::vector<std::pair<std::string, std::string>>& entries,
                   bool line_sample) {
  std::string svg;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const double middle = top + kLegendRow * double(i) + kLegendRow / 2;
    const auto& [name, color] = entries[i];
    if (line_sample)
      svg += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{2:.1f}\" y2=\"{1:.1f}\" stroke=\"{3}\" "
                         "stroke-width=\"3\"/>\n",
                         left, middle, left + 24, color);
    else
      svg += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"12\" height=\"12\" fill=\"{}\"/>\n", left + 6,
                         middle - 6, color);
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" dominant-baseline=\"middle\">{}</text>\n", left + 32, middle,
                       xml_escape(name));
  }
  return svg;
}

void check_drawable(double x, const BarRow& row, const char* what) {
  if (!std::isfinite(x) || x < 0)
    throw Error(fmt::format("svg_bar_chart: row '{}' has {} = {}; the axis starts at 0 and needs finite values",
                            row.label, what, x));
}

// The drawing shared by the linear and the log bar chart: `pos` maps a displayed value to
// [0, 1] along the axis, `ticks` are (value, label) pairs.
std::string draw_bars(const std::string& title, const std::string& x_label, const std::vector<BarRow>& rows,
                      double scale, const std::function<double(double)>& pos,
                      const std::vector<std::pair<double, std::string>>& ticks) {
  std::size_t longest_label = 0;
  for (const BarRow& row : rows) longest_label = std::max(longest_label, row.label.size());
  const double plot_left = std::clamp(double(longest_label) * kCharWidth + 16, 60.0, 520.0);
  const double plot_width = kWidth - plot_left - kValueMargin;
  const double plot_top = kTitleHeight, plot_bottom = plot_top + kRowHeight * double(rows.size());
  const double height = plot_bottom + kAxisHeight;
  auto x_of = [&](double v) { return plot_left + plot_width * pos(v * scale); };

  std::string svg = svg_open(kWidth, height, title);
  for (const auto& [tick, label] : ticks) {
    const double x = plot_left + plot_width * pos(tick);
    svg += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#ddd\"/>\n"
        "<line x1=\"{0:.1f}\" y1=\"{2}\" x2=\"{0:.1f}\" y2=\"{3}\" stroke=\"black\"/>\n"
        "<text x=\"{0:.1f}\" y=\"{4}\" text-anchor=\"middle\">{5}</text>\n",
        x, plot_top, plot_bottom, plot_bottom + 5, plot_bottom + 18, xml_escape(label));
  }
  svg += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"black\"/>\n", plot_left,
                     plot_bottom, plot_left + plot_width);
  svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", plot_left + plot_width / 2,
                     plot_bottom + 40, xml_escape(x_label));

  for (std::size_t r = 0; r < rows.size(); ++r) {
    const BarRow& row = rows[r];
    const double top = plot_top + kRowHeight * double(r), middle = top + kRowHeight / 2;
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\" dominant-baseline=\"middle\">{}</text>\n",
                       plot_left - 8, middle, xml_escape(row.label));
    if (row.value == 0 && !row.note.empty()) {
      svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" dominant-baseline=\"middle\" fill=\"#888\">{}</text>\n",
                         plot_left + 6, middle, xml_escape(row.note));
      continue;
    }
    if (row.value > 0)
      svg += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"#4e79a7\"/>\n",
                         plot_left, top + 4, x_of(row.value) - plot_left, kRowHeight - 8);
    double label_x = x_of(row.value);
    if (row.has_interval) {
      const double x_low = x_of(row.low), x_high = x_of(row.high);
      svg += fmt::format(
          "<path d=\"M{0:.1f},{2:.1f}H{1:.1f}M{0:.1f},{3:.1f}V{4:.1f}M{1:.1f},{3:.1f}V{4:.1f}\" stroke=\"black\" "
          "fill=\"none\"/>\n",
          x_low, x_high, middle, middle - 4, middle + 4);
      label_x = std::max(label_x, x_high);
    }
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" dominant-baseline=\"middle\">{:.4g}</text>\n",
                       label_x + 5, middle, row.value * scale);
  }
  return svg + "</svg>\n";
}

// The extent of a line chart's data, x in decades on a log axis; each series is checked first.
struct LineExtent {
  double x_lo = 0, x_hi = 0, y_lo = 0, y_hi = 0;
  bool integer_x = true;  // every x is whole (epochs): ticks only at whole numbers
};

LineExtent line_extent(const std::string& title, const std::vector<LineSeries>& series, bool log_x) {
  LineExtent e;
  bool any_point = false;
  for (const LineSeries& s : series) {
    const std::size_t n = s.x.size();
    const bool band = !s.band_low.empty() || !s.band_high.empty();
    if (s.y.size() != n || (band && (s.band_low.size() != n || s.band_high.size() != n)))
      throw Error(fmt::format("svg_line_chart '{}': series '{}' has {} x, {} y, {} band_low and {} band_high values; "
                              "y needs one per x, the band none or one per x",
                              title, s.name, n, s.y.size(), s.band_low.size(), s.band_high.size()));
    for (std::size_t i = 0; i < n; ++i) {
      double ys[3] = {s.y[i], band ? s.band_low[i] : s.y[i], band ? s.band_high[i] : s.y[i]};
      if (!std::isfinite(s.x[i]) || (log_x && s.x[i] <= 0))
        throw Error(fmt::format("svg_line_chart '{}': series '{}' has x = {}; x must be finite{}", title, s.name,
                                s.x[i], log_x ? " and > 0 on a log axis" : ""));
      for (double y : ys)
        if (!std::isfinite(y))
          throw Error(fmt::format("svg_line_chart '{}': series '{}' has a non-finite y or band value {} at x = {}",
                                  title, s.name, y, s.x[i]));
      const double x = log_x ? std::log10(s.x[i]) : s.x[i];
      const double lo = std::min({ys[0], ys[1], ys[2]}), hi = std::max({ys[0], ys[1], ys[2]});
      e.x_lo = any_point ? std::min(e.x_lo, x) : x;
      e.x_hi = any_point ? std::max(e.x_hi, x) : x;
      e.y_lo = any_point ? std::min(e.y_lo, lo) : lo;
      e.y_hi = any_point ? std::max(e.y_hi, hi) : hi;
      e.integer_x = e.integer_x && s.x[i] == std::round(s.x[i]);
      any_point = true;
    }
  }
  if (!any_point) e.x_lo = e.y_lo = 0, e.x_hi = e.y_hi = 1;
  return e;
}

// A line chart's x axis: where a value lies in [0, 1], and its ticks (position, label). On a log
// axis positions are in decades and the ticks are the powers of ten around them.
struct XAxis {
  std::function<double(double)> pos;
  std::vector<std::pair<double, std::string>> ticks;
};

XAxis line_x_axis(const LineExtent& e, bool log_x) {
  XAxis out;
  if (log_x) {
    const int first = int(std::floor(e.x_lo + 1e-9)), last = std::max(first + 1, int(std::ceil(e.x_hi - 1e-9)));
    out.pos = [first, last](double x) { return (std::log10(x) - first) / double(last - first); };
    for (int k = first; k <= last; ++k)
      out.ticks.push_back({double(k - first) / double(last - first), fmt::format("{:g}", std::pow(10.0, k))});
  } else {
    const LinearAxis axis = linear_axis(e.x_lo, e.x_hi, e.integer_x);
    out.pos = [axis](double x) { return axis.pos(x); };
    for (double t = axis.first; t <= axis.last + axis.step * 1e-9; t += axis.step)
      out.ticks.push_back({axis.pos(t), tick_label(t, axis.step)});
  }
  return out;
}

// A line chart's plot area and the mapping of data to its pixels.
struct LinePlot {
  static constexpr double left = 80, right = kWidth - 30, top = kTitleHeight;
  static constexpr double bottom = top + kPlotHeight, width = right - left;
  XAxis x;
  LinearAxis y;
  double px(double v) const { return left + width * x.pos(v); }
  double py(double v) const { return bottom - kPlotHeight * y.pos(v); }
};

// Grid lines, ticks, the axes and their labels.
std::string line_chart_axes(const LinePlot& p, const std::string& x_label, const std::string& y_label) {
  std::string svg;
  for (const auto& [at, label] : p.x.ticks) {
    const double x = p.left + p.width * at;
    svg += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#ddd\"/>\n"
        "<line x1=\"{0:.1f}\" y1=\"{2}\" x2=\"{0:.1f}\" y2=\"{3}\" stroke=\"black\"/>\n"
        "<text x=\"{0:.1f}\" y=\"{4}\" text-anchor=\"middle\">{5}</text>\n",
        x, p.top, p.bottom, p.bottom + 5, p.bottom + 18, xml_escape(label));
  }
  for (double t = p.y.first; t <= p.y.last + p.y.step * 1e-9; t += p.y.step) {
    const double y = p.py(t);
    svg += fmt::format(
        "<line x1=\"{1}\" y1=\"{0:.1f}\" x2=\"{2}\" y2=\"{0:.1f}\" stroke=\"#ddd\"/>\n"
        "<line x1=\"{3}\" y1=\"{0:.1f}\" x2=\"{1}\" y2=\"{0:.1f}\" stroke=\"black\"/>\n"
        "<text x=\"{4}\" y=\"{0:.1f}\" text-anchor=\"end\" dominant-baseline=\"middle\">{5}</text>\n",
        y, p.left, p.right, p.left - 5, p.left - 8, tick_label(t, p.y.step));
  }
  svg += fmt::format("<path d=\"M{0},{1}V{2}H{3}\" stroke=\"black\" fill=\"none\"/>\n", p.left, p.top, p.bottom,
                     p.right);
  svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", p.left + p.width / 2,
                     p.bottom + 40, xml_escape(x_label));
  svg += fmt::format("<text x=\"18\" y=\"{0}\" text-anchor=\"middle\" transform=\"rotate(-90 18 {0})\">{1}</text>\n",
                     p.top + kPlotHeight / 2, xml_escape(y_label));
  return svg;
}

// Each series' band, then its line and a dot at every point, in the colours of `entries`.
std::string line_chart_series(const LinePlot& p, const std::vector<LineSeries>& series,
                              const std::vector<std::pair<std::string, std::string>>& entries) {
  std::string svg;
  // Bands first, so that no band covers another series' line.
  for (std::size_t k = 0; k < series.size(); ++k) {
    const LineSeries& s = series[k];
    if (s.band_low.empty() || s.x.empty()) continue;
    std::string d;
    for (std::size_t i = 0; i < s.x.size(); ++i)
      d += fmt::format("{}{:.1f},{:.1f}", i ? "L" : "M", p.px(s.x[i]), p.py(s.band_high[i]));
    for (std::size_t i = s.x.size(); i-- > 0;) d += fmt::format("L{:.1f},{:.1f}", p.px(s.x[i]), p.py(s.band_low[i]));
    svg += fmt::format("<path d=\"{}Z\" fill=\"{}\" fill-opacity=\"0.18\" stroke=\"none\"/>\n", d, entries[k].second);
  }
  for (std::size_t k = 0; k < series.size(); ++k) {
    const LineSeries& s = series[k];
    if (s.x.size() >= 2) {
      std::string points;
      for (std::size_t i = 0; i < s.x.size(); ++i)
        points += fmt::format("{}{:.1f},{:.1f}", i ? " " : "", p.px(s.x[i]), p.py(s.y[i]));
      svg += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"/>\n", points,
                         entries[k].second);
    }
    // A dot at every point, so that a one-point series still shows.
    for (std::size_t i = 0; i < s.x.size(); ++i)
      svg += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\"/>\n", p.px(s.x[i]), p.py(s.y[i]),
                         entries[k].second);
  }
  return svg;
}

}  // namespace

std::string xml_escape(const std::string& text) {
  std::string escaped;
  escaped.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': escaped += "&amp;"; break;
      case '<': escaped += "&lt;"; break;
      case '>': escaped += "&gt;"; break;
      case '"': escaped += "&quot;"; break;
      case '\'': escaped += "&apos;"; break;
      default: escaped += c;
    }
  }
  return escaped;
}

std::string chart_color(std::size_t i) {
  static const char* const kPalette[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                         "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};
  return kPalette[i % (sizeof(kPalette) / sizeof(kPalette[0]))];
}

std::string svg_bar_chart(const std::string& title, const std::string& x_label, const std::vector<BarRow>& rows,
                          double scale) {
  if (!std::isfinite(scale) || scale <= 0)
    throw Error(fmt::format("svg_bar_chart: scale = {} must be finite and positive", scale));
  double data_max = 0;
  for (const BarRow& row : rows) {
    check_drawable(row.value, row, "value");
    data_max = std::max(data_max, row.value * scale);
    if (row.has_interval) {
      check_drawable(row.low, row, "low");
      check_drawable(row.high, row, "high");
      data_max = std::max(data_max, row.high * scale);
    }
  }
  // All-zero data still needs a non-degenerate axis.
  const double step = tick_step(data_max > 0 ? data_max : 1);
  const int intervals = std::max(1, int(std::ceil(data_max / step - 1e-9)));
  const double axis_max = step * intervals;

  std::vector<std::pair<double, std::string>> ticks;
  for (int i = 0; i <= intervals; ++i) ticks.push_back({step * i, fmt::format("{:g}", step * i)});
  return draw_bars(title, x_label, rows, scale, [axis_max](double v) { return v / axis_max; }, ticks);
}

std::string svg_log_bar_chart(const std::string& title, const std::string& x_label, const std::vector<BarRow>& rows) {
  double lo = 0, hi = 0;
  bool any = false;
  auto include = [&](double v, const BarRow& row, const char* what) {
    if (!std::isfinite(v) || v < 0)
      throw Error(fmt::format("svg_log_bar_chart: row '{}' has {} {}; values must be finite and >= 0", row.label,
                              what, v));
    if (v <= 0) return;
    const double l = std::log10(v);
    lo = any ? std::min(lo, l) : l;
    hi = any ? std::max(hi, l) : l;
    any = true;
  };
  for (const BarRow& row : rows) {
    include(row.value, row, "value");
    if (row.has_interval) {
      include(row.low, row, "low");
      include(row.high, row, "high");
    }
  }
  const int first = any ? int(std::floor(lo)) : 0, last = any ? std::max(first + 1, int(std::ceil(hi))) : 1;
  std::vector<std::pair<double, std::string>> ticks;
  for (int e = first; e <= last; ++e) ticks.push_back({std::pow(10.0, e), fmt::format("1e{}", e)});
  // Bars start at the lowest decade: a bar's length is how many decades it lies above it.
  return draw_bars(title, x_label, rows, 1.0,
                   [first, last](double v) { return v <= 0 ? 0.0 : (std::log10(v) - first) / double(last - first); },
                   ticks);
}

std::string svg_line_chart(const std::string& title, const std::string& x_label, const std::string& y_label,
                           const std::vector<LineSeries>& series, bool log_x) {
  const LineExtent extent = line_extent(title, series, log_x);
  const LinePlot plot{line_x_axis(extent, log_x), linear_axis(extent.y_lo, extent.y_hi)};
  const double legend_top = plot.bottom + kAxisHeight;
  const double height = legend_top + kLegendRow * double(series.size()) + 10;
  std::string svg = svg_open(kWidth, height, title);
  svg += line_chart_axes(plot, x_label, y_label);
  std::vector<std::pair<std::string, std::string>> entries;
  for (std::size_t k = 0; k < series.size(); ++k)
    entries.push_back({series[k].name, series[k].color.empty() ? chart_color(k) : series[k].color});
  svg += line_chart_series(plot, series, entries);
  svg += legend(legend_top, plot.left, entries, true);
  return svg + "</svg>\n";
}

std::string svg_grouped_bar_chart(const std::string& title, const std::string& x_label,
                                  const std::vector<std::string>& groups, const std::vector<BarSeries>& series) {
  constexpr double kBar = 14, kGroupGap = 10;
  double data_max = 0;
  for (const BarSeries& s : series) {
    if (s.values.size() != groups.size())
      throw Error(fmt::format("svg_grouped_bar_chart '{}': series '{}' has {} values for {} groups", title, s.name,
                              s.values.size(), groups.size()));
    for (std::size_t g = 0; g < groups.size(); ++g)
      if (s.values[g]) {
        const double v = *s.values[g];
        if (!std::isfinite(v) || v < 0)
          throw Error(fmt::format("svg_grouped_bar_chart '{}': series '{}' has value {} for group '{}'; the axis "
                                  "starts at 0 and needs finite values",
                                  title, s.name, v, groups[g]));
        data_max = std::max(data_max, v);
      }
  }
  const double step = tick_step(data_max > 0 ? data_max : 1);
  const int intervals = std::max(1, int(std::ceil(data_max / step - 1e-9)));
  const double axis_max = step * intervals;

  std::size_t longest_label = 0;
  for (const std::string& g : groups) longest_label = std::max(longest_label, g.size());
  const double plot_left = std::clamp(double(longest_label) * kCharWidth + 16, 60.0, 520.0);
  const double plot_width = kWidth - plot_left - kValueMargin;
  const double block = kBar * double(std::max<std::size_t>(1, series.size())) + kGroupGap;
  const double plot_top = kTitleHeight, plot_bottom = plot_top + block * double(groups.size());
  const double legend_top = plot_bottom + kAxisHeight;
  const double height = legend_top + kLegendRow * double(series.size()) + 10;
  auto x_of = [&](double v) { return plot_left + plot_width * v / axis_max; };

  std::string svg = svg_open(kWidth, height, title);
  for (int i = 0; i <= intervals; ++i) {
    const double x = x_of(step * i);
    svg += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#ddd\"/>\n"
        "<line x1=\"{0:.1f}\" y1=\"{2}\" x2=\"{0:.1f}\" y2=\"{3}\" stroke=\"black\"/>\n"
        "<text x=\"{0:.1f}\" y=\"{4}\" text-anchor=\"middle\">{5:g}</text>\n",
        x, plot_top, plot_bottom, plot_bottom + 5, plot_bottom + 18, step * i);
  }
  svg += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"black\"/>\n", plot_left,
                     plot_bottom, plot_left + plot_width);
  svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", plot_left + plot_width / 2,
                     plot_bottom + 40, xml_escape(x_label));

  std::vector<std::pair<std::string, std::string>> entries;
  for (std::size_t k = 0; k < series.size(); ++k)
    entries.push_back({series[k].name, series[k].color.empty() ? chart_color(k) : series[k].color});
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const double top = plot_top + block * double(g) + kGroupGap / 2;
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\" dominant-baseline=\"middle\">{}</text>\n",
                       plot_left - 8, top + (block - kGroupGap) / 2, xml_escape(groups[g]));
    for (std::size_t k = 0; k < series.size(); ++k) {
      const double bar_top = top + kBar * double(k), middle = bar_top + kBar / 2;
      const std::optional<double>& v = series[k].values[g];
      if (!v) {
        svg += fmt::format(
            "<text x=\"{:.1f}\" y=\"{:.1f}\" dominant-baseline=\"middle\" font-size=\"10\" fill=\"#888\">n/a</text>\n",
            plot_left + 6, middle);
        continue;
      }
      if (*v > 0)
        svg += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"{}\"/>\n",
                           plot_left, bar_top + 1, x_of(*v) - plot_left, kBar - 2, entries[k].second);
      svg += fmt::format(
          "<text x=\"{:.1f}\" y=\"{:.1f}\" dominant-baseline=\"middle\" font-size=\"10\">{:.3g}</text>\n",
          x_of(*v) + 5, middle, *v);
    }
  }
  svg += legend(legend_top, plot_left, entries, false);
  return svg + "</svg>\n";
}

std::string svg_histogram(const std::string& title, const std::string& x_label, const std::string& y_label,
                          const std::vector<HistogramBin>& bins) {
  double data_max = 0;
  std::size_t longest_label = 1;
  for (const HistogramBin& bin : bins) {
    if (!std::isfinite(bin.count) || bin.count < 0)
      throw Error(fmt::format("svg_histogram '{}': bin '{}' has count {}; counts must be finite and >= 0", title,
                              bin.label, bin.count));
    data_max = std::max(data_max, bin.count);
    longest_label = std::max(longest_label, bin.label.size());
  }
  const double step = tick_step(data_max > 0 ? data_max : 1);
  const int intervals = std::max(1, int(std::ceil(data_max / step - 1e-9)));
  const double axis_max = step * intervals;

  // Room above the tallest bar for its count, below the title.
  const double plot_left = 80, plot_right = kWidth - 30, plot_top = kTitleHeight + 14;
  const double plot_bottom = plot_top + kPlotHeight, plot_width = plot_right - plot_left;
  const double height = plot_bottom + kAxisHeight;
  const double slot = plot_width / double(std::max<std::size_t>(1, bins.size()));
  // With many bins, label every stride-th one so that labels do not overlap.
  const std::size_t stride =
      std::max<std::size_t>(1, std::size_t(std::ceil((double(longest_label) * kCharWidth + 6) / slot)));
  auto py = [&](double v) { return plot_bottom - kPlotHeight * v / axis_max; };

  std::string svg = svg_open(kWidth, height, title);
  for (int i = 0; i <= intervals; ++i) {
    const double y = py(step * i);
    svg += fmt::format(
        "<line x1=\"{1}\" y1=\"{0:.1f}\" x2=\"{2}\" y2=\"{0:.1f}\" stroke=\"#ddd\"/>\n"
        "<line x1=\"{3}\" y1=\"{0:.1f}\" x2=\"{1}\" y2=\"{0:.1f}\" stroke=\"black\"/>\n"
        "<text x=\"{4}\" y=\"{0:.1f}\" text-anchor=\"end\" dominant-baseline=\"middle\">{5:g}</text>\n",
        y, plot_left, plot_right, plot_left - 5, plot_left - 8, step * i);
  }
  svg += fmt::format("<path d=\"M{0},{1}V{2}H{3}\" stroke=\"black\" fill=\"none\"/>\n", plot_left, plot_top,
                     plot_bottom, plot_right);
  svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", plot_left + plot_width / 2,
                     plot_bottom + 40, xml_escape(x_label));
  svg += fmt::format("<text x=\"18\" y=\"{0}\" text-anchor=\"middle\" transform=\"rotate(-90 18 {0})\">{1}</text>\n",
                     plot_top + kPlotHeight / 2, xml_escape(y_label));
  for (std::size_t b = 0; b < bins.size(); ++b) {
    const double left = plot_left + slot * double(b), centre = left + slot / 2;
    const HistogramBin& bin = bins[b];
    if (bin.count > 0)
      svg += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"#4e79a7\"/>\n",
                         left + slot * 0.1, py(bin.count), slot * 0.8, plot_bottom - py(bin.count));
    const std::string count = fmt::format("{:g}", bin.count);
    if (slot >= double(count.size()) * kCharWidth + 4)
      svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n", centre,
                         py(bin.count) - 4, count);
    if (b % stride == 0)
      svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n", centre,
                         plot_bottom + 18, xml_escape(bin.label));
  }
  return svg + "</svg>\n";
}

namespace {
// A perceptually ordered ramp (dark blue -> teal -> green -> yellow, viridis' anchors) at t in [0, 1].
std::string ramp_color(double t) {
  static const double anchors[5][3] = {{68, 1, 84}, {59, 82, 139}, {33, 145, 140}, {94, 201, 98}, {253, 231, 37}};
  t = std::clamp(t, 0.0, 1.0) * 4;
  const int i = std::min(3, int(t));
  const double f = t - i;
  int c[3];
  for (int k = 0; k < 3; ++k) c[k] = int(std::lround(anchors[i][k] + f * (anchors[i + 1][k] - anchors[i][k])));
  return fmt::format("#{:02x}{:02x}{:02x}", c[0], c[1], c[2]);
}
}  // namespace

std::string svg_heat_map(const std::string& title, const std::string& x_label, const std::vector<std::string>& row_labels,
                         const std::vector<double>& columns, const std::vector<std::vector<std::optional<double>>>& rows) {
  if (rows.size() != row_labels.size())
    throw Error(fmt::format("svg_heat_map '{}': {} rows for {} labels", title, rows.size(), row_labels.size()));
  double lo = 0, hi = 0;
  std::size_t longest = 1;
  for (std::size_t r = 0; r < rows.size(); ++r) {
    if (rows[r].size() != columns.size())
      throw Error(fmt::format("svg_heat_map '{}': row '{}' has {} values for {} columns", title, row_labels[r],
                              rows[r].size(), columns.size()));
    longest = std::max(longest, row_labels[r].size());
    for (const auto& v : rows[r]) {
      if (!v) continue;
      if (!std::isfinite(*v) || *v < 0)
        throw Error(fmt::format("svg_heat_map '{}': row '{}' has value {}; values must be finite and >= 0", title,
                                row_labels[r], *v));
      if (*v > 0) {
        lo = lo > 0 ? std::min(lo, *v) : *v;
        hi = std::max(hi, *v);
      }
    }
  }
  const double log_lo = lo > 0 ? std::floor(std::log10(lo)) : 0, log_hi = hi > 0 ? std::ceil(std::log10(hi)) : 1;
  const double span = std::max(1.0, log_hi - log_lo);
  const double label_width = std::min(320.0, double(longest) * kCharWidth + 10);
  const double row_h = std::clamp(600.0 / double(std::max<std::size_t>(1, rows.size())), 3.0, 14.0);
  const double plot_left = label_width + 10, plot_right = kWidth - 20, plot_top = kTitleHeight + 6;
  const double plot_width = plot_right - plot_left, plot_bottom = plot_top + row_h * double(rows.size());
  const double cell_w = plot_width / double(std::max<std::size_t>(1, columns.size()));
  const double height = plot_bottom + kAxisHeight + 50;
  std::string svg = svg_open(kWidth, height, title);
  const std::size_t label_stride = std::max<std::size_t>(1, std::size_t(std::ceil(11.0 / row_h)));
  for (std::size_t r = 0; r < rows.size(); ++r) {
    const double y = plot_top + row_h * double(r);
    for (std::size_t c = 0; c < columns.size(); ++c) {
      const auto& v = rows[r][c];
      if (!v || *v <= 0) continue;
      svg += fmt::format("<rect x=\"{:.2f}\" y=\"{:.2f}\" width=\"{:.2f}\" height=\"{:.2f}\" fill=\"{}\"/>\n",
                         plot_left + cell_w * double(c), y, cell_w + 0.05, row_h + 0.05,
                         ramp_color((std::log10(*v) - log_lo) / span));
    }
    if (r % label_stride == 0)
      svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\" dominant-baseline=\"middle\" "
                         "font-size=\"{:.0f}px\">{}</text>\n",
                         plot_left - 4, y + row_h / 2, std::min(12.0, std::max(8.0, row_h)), xml_escape(row_labels[r]));
  }
  svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{:.1f}\" fill=\"none\" stroke=\"black\"/>\n",
                     plot_left, plot_top, plot_width, plot_bottom - plot_top);
  // About six x ticks at column centres.
  const std::size_t x_stride = std::max<std::size_t>(1, columns.size() / 6);
  for (std::size_t c = 0; c < columns.size(); c += x_stride)
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{:g}</text>\n",
                       plot_left + cell_w * (double(c) + 0.5), plot_bottom + 16, columns[c]);
  svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n", plot_left + plot_width / 2,
                     plot_bottom + 36, xml_escape(x_label));
  // The colour bar: log10 range, one band per tenth.
  const double bar_top = plot_bottom + 50, bar_left = plot_left, bar_width = std::min(400.0, plot_width);
  for (int k = 0; k < 40; ++k)
    svg += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"12\" fill=\"{}\"/>\n",
                       bar_left + bar_width * k / 40.0, bar_top, bar_width / 40.0 + 0.05, ramp_color((k + 0.5) / 40.0));
  svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"start\">1e{:g}</text>\n", bar_left, bar_top + 26,
                     log_lo);
  svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">1e{:g}</text>\n", bar_left + bar_width,
                     bar_top + 26, log_lo + span);
  svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"start\">white: identical</text>\n",
                     bar_left + bar_width + 12, bar_top + 10);
  return svg + "</svg>\n";
}

}  // namespace ditto

