#include "experiments/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "engine/error.h"
#include "engine/manifest.h"
#include "experiments/run_dir.h"
#include "experiments/svg.h"

namespace ditto {

namespace {

using json = nlohmann::json;

// Names come from datasets and command lines: bytes that are not valid UTF-8 must not make the
// whole report fail, so they are replaced instead of thrown on.
std::string dump(const json& j, int indent = -1) { return j.dump(indent, ' ', false, json::error_handler_t::replace); }

// ---- ordering --------------------------------------------------------------------------------

// Settings in display order: `settings` first, then any setting the data names that the list
// leaves out, in the order first met, so that no row of data silently disappears.
std::vector<std::string> ordered_settings(const ReportData& d) {
  std::vector<std::string> order;
  std::set<std::string> seen;
  auto add = [&](const std::string& s) {
    if (seen.insert(s).second) order.push_back(s);
  };
  for (const auto& s : d.settings) add(s);
  for (const auto& m : d.metrics) add(m.setting);
  for (const auto& c : d.curves) add(c.setting);
  for (const auto& g : d.groups) add(g.setting);
  for (const auto& s : d.stability) add(s.setting);
  for (const auto& e : d.unstable) add(e.setting);
  return order;
}

std::size_t rank_of(const std::vector<std::string>& order, const std::string& name) {
  return std::size_t(std::find(order.begin(), order.end(), name) - order.begin());
}

// Distinct keys in a preferred order: those in `preferred` first (in that order), then the
// others in the order first met.
template <class Key>
std::vector<Key> ordered_keys(const std::vector<Key>& met, const std::vector<Key>& preferred) {
  std::vector<Key> keys;
  for (const Key& k : preferred)
    if (std::find(met.begin(), met.end(), k) != met.end()) keys.push_back(k);
  for (const Key& k : met)
    if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
  return keys;
}

// ---- text ------------------------------------------------------------------------------------

// Round-trip precision, shortest form: the CSV holds exactly the numbers the report was given.
std::string csv_number(double v) { return fmt::format("{}", v); }

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string quoted = "\"";
  for (char c : s) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
  return quoted + "\"";
}

std::string csv_row(const std::string& setting, const std::string& metric, double value,
                    std::optional<std::pair<double, double>> interval) {
  return fmt::format("{},{},{},{},{}\n", csv_field(setting), csv_field(metric), csv_number(value),
                     interval ? csv_number(interval->first) : "", interval ? csv_number(interval->second) : "");
}

// Four significant digits: enough to compare settings by eye; the CSV and JSON hold full precision.
std::string show(double v) { return fmt::format("{:.4g}", v); }

std::string esc(const std::string& s) { return xml_escape(s); }

std::string metric_title(const std::string& metric) {
  static const std::map<std::string, std::string> names = {{"top1", "top-1 accuracy"},
                                                           {"top5", "top-5 accuracy"},
                                                           {"accuracy", "accuracy"},
                                                           {"pixel_accuracy", "pixel accuracy"},
                                                           {"mean_iou", "mean IoU"},
                                                           {"sequence_accuracy", "sequence accuracy"},
                                                           {"cer", "character error rate"},
                                                           {"fpr", "false positive rate (FPR)"},
                                                           {"fnr", "false negative rate (FNR)"}};
  auto it = names.find(metric);
  return it == names.end() ? metric : it->second;
}

std::string fig_s4_line(const ReportFigS4Point& p) {
  return p.line.empty() ? fmt::format("{}-init/{}-order", p.init, p.order) : p.line;
}

// ---- JSON ------------------------------------------------------------------------------------

json report_json(const ReportData& d) {
  json metrics = json::array(), curves = json::array(), groups = json::array(), stability = json::array(),
       unstable = json::array(), fig_s4 = json::array(), overhead = json::array();
  for (const auto& m : d.metrics)
    metrics.push_back({{"setting", m.setting},
                       {"metric", m.metric},
                       {"value", m.value},
                       {"low", m.low},
                       {"high", m.high},
                       {"has_interval", m.has_interval}});
  for (const auto& c : d.curves)
    curves.push_back({{"setting", c.setting},
                      {"metric", c.metric},
                      {"epochs", c.epochs},
                      {"mean", c.mean},
                      {"low", c.low},
                      {"high", c.high}});
  for (const auto& g : d.groups)
    groups.push_back({{"setting", g.setting},
                      {"kind", g.kind},
                      {"group", g.group},
                      {"metric", g.metric},
                      {"mean", g.mean},
                      {"std", g.std}});
  for (const auto& s : d.stability) stability.push_back({{"setting", s.setting}, {"counts", s.counts}});
  for (const auto& e : d.unstable)
    unstable.push_back({{"setting", e.setting},
                        {"index", e.index},
                        {"label", e.label},
                        {"agree", e.agree},
                        {"replicas", e.replicas},
                        {"predicted", e.predicted},
                        {"jpeg_base64", base64_encode(e.jpeg)}});
  for (const auto& p : d.fig_s4)
    fig_s4.push_back({{"lr", p.lr},
                      {"init", p.init},
                      {"order", p.order},
                      {"kernels", p.kernels},
                      {"line", fig_s4_line(p)},
                      {"disagreement", p.disagreement}});
  for (const auto& o : d.overhead)
    overhead.push_back({{"mode", o.mode}, {"ms_per_step", o.ms_per_step}, {"ratio", o.ratio}});
  json decomposition = json::array();
  for (const auto& dc : d.decomposition) {
    json terms = json::array();
    for (const auto& t : dc.terms) terms.push_back({{"name", t.name}, {"value", t.value}, {"low", t.low}, {"high", t.high}});
    decomposition.push_back(
        {{"measure", dc.measure}, {"terms", terms}, {"verdict", dc.verdict}, {"intervals", dc.intervals}});
  }
  return {{"title", d.title},       {"settings", d.settings},
          {"metrics", metrics},     {"curves", curves},
          {"groups", groups},       {"stability", stability},
          {"unstable", unstable},   {"fig_s4", fig_s4},
          {"overhead", overhead},   {"decomposition", decomposition},
          {"manifest", d.manifest}};
}

// ---- HTML pieces -----------------------------------------------------------------------------

// Runs after load in the reader's browser (and in the test's headless Chromium): a chart counts
// as drawn when its own box has area and at least one mark in it has a size. Lines and paths
// along an axis have no area, so one non-zero extent is enough for them; rectangles and circles
// need both. An example image counts when it decoded to a non-empty picture. The results go
// into #chart-check, #image-check and the title, where a headless browser's DOM dump shows them.
constexpr const char* kChartCheckScript = R"(<script>
window.addEventListener('load', function () {
  var charts = document.querySelectorAll('svg.chart'), empty = 0;
  Array.prototype.forEach.call(charts, function (svg) {
    var box = svg.getBBox();
    var drawn = Array.prototype.some.call(svg.querySelectorAll('rect, path, line, circle, polyline'), function (mark) {
      var b = mark.getBBox(), area = mark.tagName === 'rect' || mark.tagName === 'circle';
      return area ? (b.width > 0 && b.height > 0) : (b.width > 0 || b.height > 0);
    });
    if (!(box.width > 0 && box.height > 0 && drawn)) {
      ++empty;
      svg.setAttribute('data-empty', 'true');
    }
  });
  var text = 'charts=' + charts.length + ' empty=' + empty;
  document.getElementById('chart-check').textContent = text;
  // Example images: by the load event every image has loaded or failed; one that failed to
  // decode (or holds no data) has no natural size.
  var images = document.querySelectorAll('img.example'), broken = 0;
  Array.prototype.forEach.call(images, function (img) {
    if (!(img.complete && img.naturalWidth > 0 && img.naturalHeight > 0)) {
      ++broken;
      img.setAttribute('data-broken', 'true');
    }
  });
  var imageText = 'images=' + images.length + ' broken=' + broken;
  document.getElementById('image-check').textContent = imageText;
  document.title = document.title + ' | ' + text + ' | ' + imageText;
});
</script>
)";

constexpr const char* kStyle = R"(<style>
body { font-family: system-ui, sans-serif; max-width: 1200px; margin: 2em auto; padding: 0 1em; color: #222; }
h1 { font-size: 1.5em; } h2 { margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
table.summary td.num { white-space: normal; }  /* many metrics: let "value [low, high]" wrap */
div.wide { overflow-x: auto; }
svg.chart { display: block; max-width: 100%; height: auto; margin: 1em 0; }
code, pre { font-size: 0.85em; white-space: pre-wrap; word-break: break-all; }
details { margin: 0.4em 0; } summary { cursor: pointer; }
#chart-check, #image-check { color: #888; }
div.examples { display: flex; flex-wrap: wrap; gap: 0.6em; margin: 0.5em 0 1.5em; }
figure.example { margin: 0; padding: 0.4em; border: 1px solid #ddd; width: 9.5em; font-size: 0.8em; }
img.example { display: block; width: 96px; height: auto; image-rendering: pixelated; margin-bottom: 0.3em; }
figure.example .wrong { color: #b00; }
</style>
)";

std::string section(const std::string& id, const std::string& heading, const std::string& body) {
  return fmt::format("<section id=\"{}\">\n<h2>{}</h2>\n{}</section>\n", id, esc(heading), body);
}

// A bar of a setting's metric; a non-finite value (weights that blew up) is shown as a note
// rather than failing the whole report.
BarRow metric_bar(const ReportMetric& m, const std::string& zero_note) {
  BarRow row{m.setting, m.value, m.low, m.high, m.has_interval, ""};
  const bool finite = std::isfinite(m.value) && (!m.has_interval || (std::isfinite(m.low) && std::isfinite(m.high)));
  if (!finite)
    row = BarRow{m.setting, 0, 0, 0, false, fmt::format("not finite ({})", show(m.value))};
  else if (m.value == 0)
    row.note = zero_note;
  return row;
}

// Table rows: one per setting with any of `columns`, a cell per metric ("value [low, high]" where
// it has an interval, a dash where the setting lacks it). The first metric of a name wins.
std::string metric_rows(const ReportData& d, const std::vector<std::string>& settings,
                        const std::vector<std::string>& columns) {
  std::map<std::pair<std::string, std::string>, const ReportMetric*> cell;
  for (const auto& m : d.metrics) cell.emplace(std::make_pair(m.setting, m.metric), &m);
  std::string rows;
  for (const auto& s : settings) {
    std::string row;
    bool any = false;
    for (const auto& c : columns) {
      auto it = cell.find({s, c});
      if (it == cell.end()) {
        row += "<td class=\"num\">&#8212;</td>";
        continue;
      }
      any = true;
      const ReportMetric& m = *it->second;
      row += fmt::format(
          "<td class=\"num\">{}</td>",
          m.has_interval ? fmt::format("{} [{}, {}]", show(m.value), show(m.low), show(m.high)) : show(m.value));
    }
    if (any) rows += fmt::format("<tr><th>{}</th>{}</tr>\n", esc(s), row);
  }
  return rows;
}

std::string summary_section(const ReportData& d, const std::vector<std::string>& settings) {
  std::vector<std::string> met;
  for (const auto& m : d.metrics) met.push_back(m.metric);
  const std::vector<std::string> columns = ordered_keys(met, {});
  std::string html = "<div class=\"wide\">\n<table class=\"summary\">\n<tr><th>setting</th>";
  for (const auto& c : columns) html += fmt::format("<th>{}</th>", esc(c));
  html += "</tr>\n" + metric_rows(d, settings, columns);
  html += "</table>\n</div>\n<p>Value [low, high]: the interval where the experiment computed one.</p>\n";
  return section("summary", "Summary", html);
}

std::string spread_section(const ReportData& d, const std::vector<std::string>& settings, int& charts) {
  std::string html;
  auto rows_of = [&](const std::string& metric, const std::string& zero_note) {
    std::vector<BarRow> rows;
    for (const auto& s : settings)
      for (const auto& m : d.metrics)
        if (m.setting == s && m.metric == metric) {
          rows.push_back(metric_bar(m, zero_note));
          break;
        }
    return rows;
  };
  if (auto rows = rows_of("churn", "no divergence"); !rows.empty()) {
    html += svg_bar_chart("Churn: test predictions that differ between two replicas",
                          "mean pairwise churn (fraction of test examples); error bar: interval", rows);
    ++charts;
  }
  if (auto rows = rows_of("accuracy_std", "no spread"); !rows.empty()) {
    html += svg_bar_chart("Spread of test accuracy across replicas",
                          "standard deviation of test accuracy; error bar: interval", rows);
    ++charts;
  }
  if (auto rows = rows_of("weight_l2", "identical weights"); !rows.empty()) {
    // A linear axis would flatten the smaller distances to nothing when one setting's weights
    // lie orders of magnitude further apart (CONTROL ~0, IMPL ~1e-6, ALGO ~10).
    double lo = 0, hi = 0;
    for (const BarRow& r : rows)
      for (double v : {r.value, r.has_interval ? r.low : 0.0, r.has_interval ? r.high : 0.0})
        if (v > 0) lo = lo > 0 ? std::min(lo, v) : v, hi = std::max(hi, v);
    const bool log_axis = lo > 0 && hi / lo >= 100;
    const std::string title = "L2 distance between the replicas' final weights";
    html += log_axis ? svg_log_bar_chart(title, "mean pairwise L2 distance (log scale); error bar: interval", rows)
                     : svg_bar_chart(title, "mean pairwise L2 distance; error bar: interval", rows);
    ++charts;
  }
  return html.empty() ? "" : section("spread", "Spread between replicas", html);
}

std::string curves_section(const ReportData& d, const std::vector<std::string>& settings, int& charts) {
  std::vector<std::string> met;
  for (const auto& c : d.curves) met.push_back(c.metric);
  std::string html;
  for (const auto& metric :
       ordered_keys(met, {"top1", "top5", "pixel_accuracy", "mean_iou", "sequence_accuracy", "cer"})) {
    std::vector<LineSeries> series;
    for (std::size_t k = 0; k < settings.size(); ++k)
      for (const auto& c : d.curves)
        if (c.setting == settings[k] && c.metric == metric) {
          LineSeries s{c.setting, {}, c.mean, c.low, c.high, chart_color(k)};
          s.x.assign(c.epochs.begin(), c.epochs.end());
          series.push_back(std::move(s));
          break;
        }
    html += svg_line_chart(
        fmt::format("Test {} per epoch: mean over replicas, band from lowest to highest replica", metric_title(metric)),
        "epoch", metric_title(metric), series);
    ++charts;
  }
  return html.empty() ? "" : section("curves", "Accuracy per epoch", html);
}

std::string groups_section(const ReportData& d, const std::vector<std::string>& settings, int& charts) {
  using Key = std::pair<std::string, std::string>;  // (kind, metric)
  std::vector<Key> met;
  for (const auto& g : d.groups) met.push_back({g.kind, g.metric});
  std::string html;
  for (const auto& [kind, metric] : ordered_keys<Key>(
           met, {{"class", "accuracy"}, {"subgroup", "accuracy"}, {"subgroup", "fpr"}, {"subgroup", "fnr"}})) {
    std::vector<std::string> group_names;
    for (const auto& g : d.groups)
      if (g.kind == kind && g.metric == metric &&
          std::find(group_names.begin(), group_names.end(), g.group) == group_names.end())
        group_names.push_back(g.group);
    std::vector<BarSeries> series;
    std::vector<std::vector<const ReportGroup*>> cells;  // [series][group], for the table
    for (std::size_t k = 0; k < settings.size(); ++k) {
      BarSeries s{settings[k], std::vector<std::optional<double>>(group_names.size()), chart_color(k)};
      std::vector<const ReportGroup*> row(group_names.size(), nullptr);
      bool any = false;
      for (const auto& g : d.groups)
        if (g.setting == settings[k] && g.kind == kind && g.metric == metric) {
          const std::size_t at = rank_of(group_names, g.group);
          if (row[at]) continue;  // first one wins, as in the summary table
          row[at] = &g;
          // A non-finite spread is left out of the chart ("n/a") but shown in the table.
          if (std::isfinite(g.std)) s.values[at] = g.std;
          any = true;
        }
      if (!any) continue;
      series.push_back(std::move(s));
      cells.push_back(std::move(row));
    }
    const std::string what = fmt::format("{} {}", kind == "class" ? "Per-class" : "Per-" + kind, metric_title(metric));
    html += svg_grouped_bar_chart(what + ": standard deviation across replicas", "standard deviation across replicas",
                                  group_names, series);
    ++charts;
    std::string table = "<table>\n<tr><th>" + esc(kind) + "</th>";
    for (const auto& s : series) table += fmt::format("<th>{}</th>", esc(s.name));
    table += "</tr>\n";
    for (std::size_t g = 0; g < group_names.size(); ++g) {
      table += fmt::format("<tr><th>{}</th>", esc(group_names[g]));
      for (const auto& row : cells)
        table += row[g] ? fmt::format("<td class=\"num\">{} &#177; {}</td>", show(row[g]->mean), show(row[g]->std))
                        : std::string("<td class=\"num\">&#8212;</td>");
      table += "</tr>\n";
    }
    html += fmt::format(
        "<details><summary>{}: mean &#177; standard deviation over replicas</summary>\n{}</table>\n"
        "</details>\n",
        esc(what), table);
  }
  return html.empty() ? "" : section("groups", "Per-class and per-subgroup spread", html);
}

// The ensemble (the replicas' plurality vote) on the examples the replicas do not all agree on,
// against the rest, from the metrics experiments/ensemble.h computes; "" when there are none.
std::string ensemble_table(const ReportData& d, const std::vector<std::string>& settings) {
  const std::string rows = metric_rows(d, settings,
                                       {"unstable_examples", "ensemble_accuracy", "ensemble_acc_unstable",
                                        "ensemble_acc_stable", "replica_acc_unstable"});
  if (rows.empty()) return "";
  return "<h3>The ensemble on the unstable examples</h3>\n<p>Unstable: the test examples on which not every replica "
         "predicts the same label. The ensemble predicts each example's plurality label over the replicas (ties: the "
         "smallest label); its accuracy with a bootstrap 95% interval over the examples of each subset. Replica "
         "accuracy: the replicas' mean accuracy on the unstable examples.</p>\n<table>\n<tr><th>setting</th>"
         "<th>unstable examples</th><th>ensemble accuracy (all)</th><th>ensemble accuracy, unstable</th>"
         "<th>ensemble accuracy, the rest</th><th>replica accuracy, unstable</th></tr>\n" +
         rows + "</table>\n";
}

std::string stability_section(const ReportData& d, const std::vector<std::string>& settings, int& charts) {
  std::vector<const ReportStability*> stability;
  for (const auto& s : d.stability) stability.push_back(&s);
  std::stable_sort(stability.begin(), stability.end(), [&](const ReportStability* a, const ReportStability* b) {
    return rank_of(settings, a->setting) < rank_of(settings, b->setting);
  });
  std::string html, table;
  for (const ReportStability* s : stability) {
    const std::size_t replicas = s->counts.size();
    int64_t total = 0;
    std::vector<HistogramBin> bins;
    for (std::size_t k = 0; k < replicas; ++k) {
      bins.push_back({std::to_string(k + 1), double(s->counts[k])});
      total += s->counts[k];
    }
    html += svg_histogram(
        fmt::format("{}: per-example stability ({} replicas, {} test examples)", s->setting, replicas, total),
        fmt::format("replicas that predict the example's majority label ({} = all agree)", replicas), "test examples",
        bins);
    ++charts;
    const int64_t all_agree = replicas ? s->counts.back() : 0;
    table += fmt::format(
        "<tr><th>{}</th><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>"
        "</tr>\n",
        esc(s->setting), total, all_agree, total ? show(double(all_agree) / double(total)) : "&#8212;");
  }
  if (!table.empty())
    html = "<table>\n<tr><th>setting</th><th>test examples</th><th>all replicas agree</th><th>fraction</th></tr>\n" +
           table + "</table>\n" + html;

  html += ensemble_table(d, settings);
  if (!d.unstable.empty()) {
    std::vector<const ReportExample*> examples;
    for (const auto& e : d.unstable) examples.push_back(&e);
    std::stable_sort(examples.begin(), examples.end(), [&](const ReportExample* a, const ReportExample* b) {
      return rank_of(settings, a->setting) < rank_of(settings, b->setting);
    });
    html +=
        "<h3>Least stable test examples</h3>\n<p>Per setting, the test examples on which the replicas disagree most "
        "(the highest fraction of replica pairs that disagree), as the network saw them: the test image, its true "
        "label, how many replicas predict its majority label, and each replica's prediction in replica order "
        "(wrong ones in red).</p>\n";
    std::string current;
    bool open = false;
    for (const ReportExample* e : examples) {
      if (!open || e->setting != current) {
        if (open) html += "</div>\n";
        html += fmt::format("<h4>{}</h4>\n<div class=\"examples\">\n", esc(e->setting));
        current = e->setting;
        open = true;
      }
      std::string predicted;
      for (std::size_t r = 0; r < e->predicted.size(); ++r)
        predicted += fmt::format("{}{}", r ? ", " : "",
                                 e->predicted[r] == e->label ? esc(e->predicted[r])
                                                             : "<span class=\"wrong\">" + esc(e->predicted[r]) + "</span>");
      const std::string image =
          e->jpeg.empty() ? std::string("<div>(no image)</div>")
                          : fmt::format("<img class=\"example\" src=\"data:image/jpeg;base64,{}\" alt=\"test example {}\">",
                                        base64_encode(e->jpeg), e->index);
      html += fmt::format(
          "<figure class=\"example\">{}<figcaption>#{} <b>{}</b><br>{} of {} replicas agree{}</figcaption></figure>\n",
          image, e->index, esc(e->label), e->agree, e->replicas,
          predicted.empty() ? "" : "<br>predicted: " + predicted);
    }
    html += "</div>\n";
  }
  return html.empty() ? "" : section("stability", "Per-example stability", html);
}

std::string fig_s4_section(const ReportData& d, int& charts) {
  if (d.fig_s4.empty()) return "";
  // Lines in the order first met (the protocol's cell order), points by learning rate.
  std::vector<std::string> names;
  std::map<std::string, std::vector<const ReportFigS4Point*>> lines;
  std::set<double> lrs;
  bool log_x = true;
  for (const auto& p : d.fig_s4) {
    const std::string line = fig_s4_line(p);
    if (!lines.count(line)) names.push_back(line);
    lines[line].push_back(&p);
    lrs.insert(p.lr);
    log_x = log_x && p.lr > 0;
  }
  std::vector<LineSeries> series;
  std::string table = "<table>\n<tr><th>cell</th><th>kernels</th>";
  for (double lr : lrs) table += fmt::format("<th>lr {}</th>", show(lr));
  table += "</tr>\n";
  for (const auto& name : names) {
    auto& points = lines[name];
    std::stable_sort(points.begin(), points.end(),
                     [](const ReportFigS4Point* a, const ReportFigS4Point* b) { return a->lr < b->lr; });
    LineSeries s;
    s.name = name;
    if (name == "CONTROL") s.color = "#777777";  // the zero line
    std::set<std::string> kernels;
    std::map<double, double> by_lr;
    for (const ReportFigS4Point* p : points) {
      s.x.push_back(p->lr);
      s.y.push_back(p->disagreement);
      if (!p->kernels.empty()) kernels.insert(p->kernels);
      by_lr[p->lr] = p->disagreement;
    }
    std::string kernel_text;
    for (const auto& k : kernels) kernel_text += (kernel_text.empty() ? "" : ", ") + k;
    table += fmt::format("<tr><th>{}</th><td>{}</td>", esc(name), kernel_text.empty() ? "&#8212;" : esc(kernel_text));
    for (double lr : lrs)
      table += by_lr.count(lr) ? fmt::format("<td class=\"num\">{}</td>", show(by_lr[lr])) : "<td>&#8212;</td>";
    table += "</tr>\n";
    series.push_back(std::move(s));
  }
  table += "</table>\n";
  const bool control = lines.count("CONTROL") > 0;
  ++charts;
  return section(
      "fig-s4", "Disagreement by learning rate (figure S4)",
      svg_line_chart("Fraction of test examples on which the replicas do not all agree",
                     log_x ? "learning rate (log scale)" : "learning rate", "disagreement (fraction of test examples)",
                     series, log_x) +
          (control ? "<p>CONTROL: deterministic kernels with initialization and batch order fixed, the zero line. "
                     "The fixed-init/fixed-order cell differs from it only in its kernels: whatever it shows above "
                     "zero is GPU (implementation) noise alone.</p>\n"
                   : "") +
          table);
}

// The decomposition of noise over the four settings: a table per measure, and what it says.
std::string decomposition_section(const ReportData& d) {
  if (d.decomposition.empty()) return "";
  static const std::map<std::string, std::string> meaning = {
      {"excess", "ALGO+IMPL &#8722; ALGO: what GPU noise adds on top of seed noise"},
      {"additive", "ALGO + IMPL &#8722; CONTROL: ALGO+IMPL if the two sources added up"},
      {"interaction", "ALGO+IMPL &#8722; ALGO &#8722; IMPL + CONTROL"}};
  static const std::map<std::string, std::string> verdicts = {
      {"additive", "consistent with additive: the interaction's interval covers 0"},
      {"sub-additive",
       "sub-additive: together the two sources move less than the sum of each alone (they overlap: either one "
       "alone already moves much of what the other would)"},
      {"super-additive", "super-additive: together the two sources move more than the sum of each alone"}};
  std::string html =
      "<p>Is GPU noise additive to algorithmic (seed) noise, or do they interact? For a noise measure X, the "
      "2&#215;2 design's interaction contrast X(ALGO+IMPL) &#8722; X(ALGO) &#8722; X(IMPL) + X(CONTROL) is 0 when the "
      "sources add, below 0 when they overlap, above 0 when they amplify each other.</p>\n";
  for (const auto& dc : d.decomposition) {
    const std::string title = dc.measure == "churn" ? "Churn" : dc.measure == "accuracy_variance"
                                                                    ? "Variance of replica accuracy"
                                                                    : dc.measure;
    html += fmt::format("<h3>{}</h3>\n<table>\n<tr><th>term</th><th>value [95% interval]</th><th></th></tr>\n",
                        esc(title));
    for (const auto& t : dc.terms) {
      auto it = meaning.find(t.name);
      html += fmt::format("<tr><th>{}</th><td class=\"num\">{} [{}, {}]</td><td>{}</td></tr>\n", esc(t.name),
                          show(t.value), show(t.low), show(t.high), it == meaning.end() ? "" : it->second);
    }
    auto v = verdicts.find(dc.verdict);
    html += fmt::format("</table>\n<p><b>{}</b>. Intervals: {}</p>\n",
                        v == verdicts.end() ? esc(dc.verdict) : v->second, esc(dc.intervals));
  }
  return section("decomposition", "Decomposition of noise: additive or interacting?", html);
}

std::string overhead_section(const ReportData& d, int& charts) {
  if (d.overhead.empty()) return "";
  std::vector<BarRow> rows;
  std::string table = "<table>\n<tr><th>kernel mode</th><th>ms per step</th><th>ratio to heuristic</th></tr>\n";
  for (const auto& o : d.overhead) {
    BarRow row{fmt::format("{} ({}x)", o.mode, show(o.ratio)), o.ms_per_step, 0, 0, false, ""};
    if (!std::isfinite(o.ms_per_step)) row = BarRow{row.label, 0, 0, 0, false, "not measured"};
    rows.push_back(row);
    table += fmt::format("<tr><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td></tr>\n", esc(o.mode),
                         show(o.ms_per_step), show(o.ratio));
  }
  ++charts;
  return section(
      "overhead", "Overhead of the kernel modes",
      svg_bar_chart("Time per training step by kernel mode", "ms per step (ratio to heuristic in parentheses)", rows) +
          table + "</table>\n");
}

// One line of text for a manifest value: strings as they are, lists of plain values joined by
// spaces (an argv reads as a command line), anything deeper as compact JSON.
std::string manifest_text(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_array() && std::all_of(v.begin(), v.end(), [](const json& e) { return e.is_primitive(); })) {
    std::string joined;
    for (const auto& e : v) joined += (joined.empty() ? "" : " ") + manifest_text(e);
    return joined;
  }
  return dump(v);
}

void flatten(const json& v, const std::string& prefix, std::vector<std::pair<std::string, std::string>>& out) {
  if (v.is_object() && !v.empty()) {
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (prefix.empty() && it.key() == "kernels") continue;  // shown per setting below
      flatten(it.value(), prefix.empty() ? it.key() : prefix + "." + it.key(), out);
    }
    return;
  }
  out.push_back({prefix, manifest_text(v)});
}

std::string manifest_section(const ReportData& d, const std::vector<std::string>& settings) {
  const json& m = d.manifest;
  if (m.is_null() || (m.is_object() && m.empty())) return "";
  if (!m.is_object()) return section("manifest", "Manifest", "<pre>" + esc(dump(m, 2)) + "</pre>\n");

  std::vector<std::pair<std::string, std::string>> entries;
  flatten(m, "", entries);
  // What a reader checks first — the GPU, the library versions, the commit, the command line —
  // at the top, whatever object the experiment nested them in.
  static const std::vector<std::string> first = {"gpu",    "gpu_name",     "device", "driver",
                                                 "cuda",   "cuda_runtime", "cudnn",  "cudnn_build",
                                                 "cublas", "git_commit",   "commit", "command_line"};
  auto priority = [](const std::string& key) {
    const std::string last = key.substr(key.rfind('.') == std::string::npos ? 0 : key.rfind('.') + 1);
    return std::size_t(std::find(first.begin(), first.end(), last) - first.begin());
  };
  std::stable_sort(entries.begin(), entries.end(),
                   [&](const auto& a, const auto& b) { return priority(a.first) < priority(b.first); });
  std::string html;
  if (!entries.empty()) {
    html += "<table>\n";
    for (const auto& [key, value] : entries)
      html += fmt::format("<tr><th>{}</th><td><code>{}</code></td></tr>\n", esc(key), esc(value));
    html += "</table>\n";
  }
  if (m.contains("kernels")) {
    const json& kernels = m["kernels"];
    if (kernels.is_object()) {
      std::vector<std::string> names;
      for (auto it = kernels.begin(); it != kernels.end(); ++it) names.push_back(it.key());
      html += "<h3>Kernels each layer ran, per setting</h3>\n";
      for (const auto& s : ordered_keys(names, settings)) {
        const json& list = kernels[s];
        std::string lines;
        std::size_t count = 1;
        if (list.is_array()) {
          count = list.size();
          for (const auto& k : list) lines += manifest_text(k) + "\n";
        } else {
          lines = dump(list, 2);
        }
        html += fmt::format("<details><summary>{}: {} kernel choice{}</summary>\n<pre>{}</pre>\n</details>\n", esc(s),
                            count, count == 1 ? "" : "s", esc(lines));
      }
    } else {
      html += "<h3>Kernels</h3>\n<pre>" + esc(dump(kernels, 2)) + "</pre>\n";
    }
  }
  return html.empty() ? "" : section("manifest", "Manifest", html);
}

}  // namespace

std::string base64_encode(const std::vector<uint8_t>& bytes) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  std::size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const uint32_t v = uint32_t(bytes[i]) << 16 | uint32_t(bytes[i + 1]) << 8 | bytes[i + 2];
    for (int shift : {18, 12, 6, 0}) out += kAlphabet[(v >> shift) & 63];
  }
  if (const std::size_t rest = bytes.size() - i; rest > 0) {
    const uint32_t v = uint32_t(bytes[i]) << 16 | (rest == 2 ? uint32_t(bytes[i + 1]) << 8 : 0);
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += rest == 2 ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::string report_csv(const ReportData& d) {
  std::string csv = "setting,metric,value,ci_low,ci_high\n";
  for (const auto& m : d.metrics)
    csv += csv_row(m.setting, m.metric, m.value,
                   m.has_interval ? std::optional<std::pair<double, double>>({m.low, m.high}) : std::nullopt);
  for (const auto& g : d.groups)
    csv += csv_row(g.setting, fmt::format("{}:{}:{}_std", g.kind, g.group, g.metric), g.std, std::nullopt);
  for (const auto& c : d.curves) {
    if (c.mean.size() != c.epochs.size() || (!c.low.empty() && c.low.size() != c.epochs.size()) ||
        (!c.high.empty() && c.high.size() != c.epochs.size()))
      throw Error(fmt::format("report: curve {} of setting '{}' has {} epochs but {} means, {} lows, {} highs",
                              c.metric, c.setting, c.epochs.size(), c.mean.size(), c.low.size(), c.high.size()));
    const bool band = !c.low.empty() && !c.high.empty();
    for (std::size_t i = 0; i < c.epochs.size(); ++i)
      csv += csv_row(c.setting, fmt::format("{}@epoch{}", c.metric, c.epochs[i]), c.mean[i],
                     band ? std::optional<std::pair<double, double>>({c.low[i], c.high[i]}) : std::nullopt);
  }
  for (const auto& p : d.fig_s4)
    csv += csv_row(fig_s4_line(p), fmt::format("disagreement@lr{:g}", p.lr), p.disagreement, std::nullopt);
  for (const auto& dc : d.decomposition)
    for (const auto& t : dc.terms)
      csv += csv_row("decomposition:" + dc.measure, t.name, t.value, std::make_pair(t.low, t.high));
  return csv;
}

std::string report_html(const ReportData& d) {
  const std::vector<std::string> settings = ordered_settings(d);
  const std::string title = d.title.empty() ? "ditto experiment report" : d.title;
  int charts = 0;
  std::size_t images = 0;
  for (const auto& e : d.unstable) images += e.jpeg.empty() ? 0 : 1;
  std::string body;
  if (!d.metrics.empty()) body += summary_section(d, settings);
  body += spread_section(d, settings, charts);
  body += curves_section(d, settings, charts);
  body += groups_section(d, settings, charts);
  body += decomposition_section(d);
  body += stability_section(d, settings, charts);
  body += fig_s4_section(d, charts);
  body += overhead_section(d, charts);
  body += manifest_section(d, settings);
  return fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{0}</title>\n{1}</head>\n"
      "<body>\n<h1>{0}</h1>\n{2}<footer>\n<p>Charts drawn (checked in the browser after loading; {3} expected):</p>\n"
      "<pre id=\"chart-check\">not checked: scripts are off</pre>\n<p>Example images shown ({5} expected):</p>\n"
      "<pre id=\"image-check\">not checked: scripts are off</pre>\n</footer>\n{4}</body>\n</html>\n",
      esc(title), kStyle, body, charts, kChartCheckScript, images);
}

void write_report(const std::string& dir, const ReportData& data) {
  // All three texts first: data a chart refuses must not leave a folder with a new report.json
  // beside an old report.html.
  const std::string json_text = dump(report_json(data), 2) + "\n";
  const std::string csv = report_csv(data);
  const std::string html = report_html(data);
  make_output_folder(dir);
  const std::filesystem::path folder(dir);
  write_file_atomic((folder / "report.json").string(), json_text);
  write_file_atomic((folder / "report.csv").string(), csv);
  write_file_atomic((folder / "report.html").string(), html);
}

}  // namespace ditto
