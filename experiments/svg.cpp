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

std::string xml_escape(const std::string& text) {
  std::string escaped;
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

// Smallest step from {1, 2, 2.5, 5, 10} x 10^k that covers axis_max in at most four steps; as each
// candidate is at most twice the previous, it also takes at least three, so 4-5 ticks with 0.
double tick_step(double axis_max) {
  const double raw = axis_max / 4;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  for (double nice : {1.0, 2.0, 2.5, 5.0})
    if (nice * magnitude >= raw * (1 - 1e-9)) return nice * magnitude;
  return 10 * magnitude;
}

void check_drawable(double x, const BarRow& row, const char* what) {
  if (!std::isfinite(x) || x < 0)
    throw Error(fmt::format("svg_bar_chart: row '{}' has {} = {}; the axis starts at 0 and needs finite values",
                            row.label, what, x));
}

}  // namespace

// The drawing shared by the linear and the log chart: `pos` maps a displayed value to [0, 1]
// along the axis, `ticks` are (value, label) pairs.
std::string draw_bars(const std::string& title, const std::string& x_label, const std::vector<BarRow>& rows,
                      double scale, const std::function<double(double)>& pos,
                      const std::vector<std::pair<double, std::string>>& ticks);

std::string svg_bar_chart(const std::string& title, const std::string& x_label, const std::vector<BarRow>& rows,
                          double scale) {
  if (!std::isfinite(scale) || scale <= 0)
    throw Error(fmt::format("svg_bar_chart: scale = {} must be finite and positive", scale));
  double data_max = 0;
  std::size_t longest_label = 0;
  for (const BarRow& row : rows) {
    check_drawable(row.value, row, "value");
    data_max = std::max(data_max, row.value * scale);
    if (row.has_interval) {
      check_drawable(row.low, row, "low");
      check_drawable(row.high, row, "high");
      data_max = std::max(data_max, row.high * scale);
    }
    longest_label = std::max(longest_label, row.label.size());
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
  for (const BarRow& row : rows) {
    if (!std::isfinite(row.value) || row.value < 0)
      throw Error(fmt::format("svg_log_bar_chart: row '{}' has value {}; values must be finite and >= 0", row.label,
                              row.value));
    if (row.value <= 0) continue;
    const double l = std::log10(row.value);
    lo = any ? std::min(lo, l) : l;
    hi = any ? std::max(hi, l) : l;
    any = true;
  }
  const int first = any ? int(std::floor(lo)) : 0, last = any ? std::max(first + 1, int(std::ceil(hi))) : 1;
  std::vector<std::pair<double, std::string>> ticks;
  for (int e = first; e <= last; ++e) ticks.push_back({std::pow(10.0, e), fmt::format("1e{}", e)});
  // Bars start at the lowest decade: a bar's length is how many decades it lies above it.
  return draw_bars(title, x_label, rows, 1.0,
                   [first, last](double v) { return v <= 0 ? 0.0 : (std::log10(v) - first) / double(last - first); },
                   ticks);
}

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

  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"monospace\" font-size=\"12\" style=\"background:white\">\n"
      "<text x=\"{2}\" y=\"24\" text-anchor=\"middle\" font-size=\"15\" font-weight=\"bold\">{3}</text>\n",
      kWidth, height, kWidth / 2, xml_escape(title));
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

}  // namespace ditto
