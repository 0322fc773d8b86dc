// The experiment report: report.csv and report.json hold exactly the hand-given numbers,
// report.html has one chart per filled section and escapes every name, and — rendered in headless
// Chromium — every chart draws something, while a page with an emptied chart is caught. Also
// the line, grouped-bar and histogram charts the report draws with.
#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "datasets/dataset.h"
#include "engine/error.h"
#include "engine/manifest.h"
#include "experiments/report.h"
#include "experiments/svg.h"
#include "train_support.h"

using namespace ditto;
using json = nlohmann::json;

namespace {

std::size_t count_occurrences(const std::string& haystack, const std::string& needle) {
  std::size_t count = 0;
  for (std::size_t at = haystack.find(needle); at != std::string::npos; at = haystack.find(needle, at + 1)) ++count;
  return count;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

bool has_line(const std::string& text, const std::string& line) {
  return text.rfind(line + "\n", 0) == 0 || text.find("\n" + line + "\n") != std::string::npos;
}

const std::vector<std::string> kSettings = {"ALGO+IMPL", "ALGO", "CONTROL"};

// A real JPEG of a 32 x 32 colour gradient (what a CIFAR thumbnail is), different per id.
std::vector<uint8_t> thumbnail(int id) {
  std::vector<uint8_t> pixels(3 * 32 * 32);
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < 32; ++y)
      for (int x = 0; x < 32; ++x) pixels[(c * 32 + y) * 32 + x] = uint8_t((x * 8 * (c + 1) + y * 4 * id) % 256);
  return encode_jpeg(pixels.data(), 3, 32, 32);
}
const std::vector<std::string> kSubgroups = {"Blond_Hair=1 & Male=0", "Blond_Hair=0 & Male=1"};
// A class name with a comma and quotes: its CSV field must be quoted.
const std::vector<std::string> kClasses = {"airplane", "ship, \"big\"", "cat"};

// Every section filled: 3 settings, each with all metrics, top-1/top-5 curves, per-class and
// per-subgroup spreads, a stability histogram; least stable examples, figure S4 (4 lines x 3
// learning rates), overhead and a manifest.
ReportData full_report() {
  ReportData d;
  d.title = "smallcnn <test> & cifar10: 3 replicas x 4 epochs";
  d.settings = kSettings;
  const double churn[] = {0.0912, 0.0875, 0}, acc_std[] = {0.0061, 0.0055, 0};
  // Weight distances five decades apart: the chart must switch to its log axis.
  const double l2[] = {12.5, 0.000125, 0};
  for (std::size_t s = 0; s < kSettings.size(); ++s) {
    const std::string& name = kSettings[s];
    d.metrics.push_back({name, "churn", churn[s], churn[s] * 0.9, churn[s] * 1.1, s < 2});
    d.metrics.push_back({name, "disagreement", churn[s] * 2, 0, 0, false});
    d.metrics.push_back({name, "accuracy_mean", 0.71 - 0.01 * double(s), 0, 0, false});
    d.metrics.push_back({name, "accuracy_std", acc_std[s], acc_std[s] * 0.5, acc_std[s] * 1.5, s < 2});
    d.metrics.push_back({name, "weight_l2", l2[s], l2[s] * 0.8, l2[s] * 1.2, s < 2});
    d.metrics.push_back({name, "distinct_fingerprints", s < 2 ? 3.0 : 1.0, 0, 0, false});
    d.metrics.push_back({name, "seconds_per_epoch", 2.5 + double(s), 0, 0, false});
    for (const char* metric : {"top1", "top5"}) {
      const double base = metric == std::string("top1") ? 0.4 : 0.8;
      ReportCurve c{name, metric, {1, 2, 3, 4}, {}, {}, {}};
      for (int e = 1; e <= 4; ++e) {
        c.mean.push_back(base + 0.05 * e);
        c.low.push_back(base + 0.05 * e - 0.01 * double(2 - std::min<std::size_t>(s, 2)));
        c.high.push_back(base + 0.05 * e + 0.01 * double(2 - std::min<std::size_t>(s, 2)));
      }
      d.curves.push_back(c);
    }
    for (std::size_t k = 0; k < kClasses.size(); ++k)
      d.groups.push_back(
          {name, "class", kClasses[k], "accuracy", 0.7 + 0.01 * double(k), 0.02 + 0.001 * double(k + s)});
    for (std::size_t g = 0; g < kSubgroups.size(); ++g)
      for (const char* metric : {"accuracy", "fpr", "fnr"})
        d.groups.push_back({name, "subgroup", kSubgroups[g], metric, 0.3, 0.01 * double(g + 1) + 0.001 * double(s)});
    d.stability.push_back({name, s < 2 ? std::vector<int64_t>{0, 91, 909} : std::vector<int64_t>{0, 0, 1000}});
  }
  d.unstable = {{"ALGO+IMPL", 17, "cat", 1, 3, {"cat", "airplane", "ship, \"big\""}, thumbnail(1)},
                {"ALGO+IMPL", 4242, "ship, \"big\"", 2, 3, {"ship, \"big\"", "cat", "ship, \"big\""}, thumbnail(2)},
                {"ALGO", 8, "airplane", 2, 3, {"airplane", "airplane", "cat"}, thumbnail(3)}};
  for (const char* init : {"fixed", "random"})
    for (const char* order : {"fixed", "random"})
      for (double lr : {1e-4, 1e-3, 1e-2})
        d.fig_s4.push_back(
            {lr, init, order,
             (init == std::string("random") ? 0.1 : 0.05) + (order == std::string("random") ? 0.02 : 0) + lr,
             "heuristic", ""});
  for (double lr : {1e-4, 1e-3, 1e-2}) d.fig_s4.push_back({lr, "fixed", "fixed", 0, "deterministic", "CONTROL"});
  d.decomposition = {
      {"churn",
       {{"ALGO+IMPL", 0.0912, 0.09, 0.093},
        {"ALGO", 0.0875, 0.086, 0.089},
        {"IMPL", 0.031, 0.03, 0.032},
        {"CONTROL", 0, 0, 0},
        {"excess", 0.0037, 0.002, 0.005},
        {"additive", 0.1185, 0.117, 0.12},
        {"interaction", -0.0273, -0.029, -0.0256}},
       "sub-additive",
       "a paired bootstrap over the 1000 test examples"},
      {"accuracy_variance",
       {{"ALGO+IMPL", 3.7e-5, 1e-5, 6e-5},
        {"ALGO", 3e-5, 1e-5, 5e-5},
        {"IMPL", 1e-5, 0, 2e-5},
        {"CONTROL", 0, 0, 0},
        {"excess", 7e-6, -3e-5, 4e-5},
        {"additive", 4e-5, 1e-5, 6e-5},
        {"interaction", -3e-6, -4e-5, 3e-5}},
       "additive",
       "a bootstrap over each setting's replicas"}};
  d.overhead = {{"heuristic", 10.0, 1.0}, {"deterministic", 12.5, 1.25}, {"nondeterministic", 9.5, 0.95}};
  d.manifest = {{"gpu", "NVIDIA H100 80GB HBM3"},
                {"driver", "580.65.06"},
                {"cuda", "13.0"},
                {"cudnn", "9.10.2"},
                {"git_commit", "92cdc83"},
                {"command_line", {"ditto-experiment", "--replicas", "3", "--out", "runs/x"}},
                {"kernels",
                 {{"ALGO+IMPL", {"conv1.fwd=implicit_gemm", "conv1.bwd_filter=algo0", "pool1.bwd=atomic-scatter"}},
                  {"ALGO", {"conv1.fwd=implicit_gemm", "conv1.bwd_filter=algo1"}},
                  {"CONTROL", {"conv1.fwd=implicit_gemm", "conv1.bwd_filter=algo1"}}}}};
  return d;
}

// Charts of full_report(): churn, accuracy_std, weight_l2 (3); top-1 and top-5 curves (2);
// per-class accuracy and per-subgroup accuracy, FPR and FNR (4); one stability histogram per
// setting (3); figure S4 (1); overhead (1).
constexpr int kFullCharts = 14;
// Least stable examples of full_report() with an image.
constexpr int kFullImages = 3;

// ---- headless Chromium -------------------------------------------------------------------------

std::string shell_quote(const std::string& s) {
  std::string quoted = "'";
  for (char c : s) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

// DITTO_CHROMIUM, else chromium or chromium-browser on PATH; "" when there is none.
std::string find_chromium() {
  if (const char* env = std::getenv("DITTO_CHROMIUM"); env && *env) return env;
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "");
  for (std::string dir; std::getline(dirs, dir, ':');)
    for (const char* name : {"chromium", "chromium-browser"}) {
      const std::string candidate = (std::filesystem::path(dir.empty() ? "." : dir) / name).string();
      if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    }
  return "";
}

// Loads the page in headless Chromium and returns the DOM after its scripts ran.
std::string rendered_dom(const std::string& html_path) {
  const std::string chromium = find_chromium();
  if (chromium.empty())
    FAIL(
        "no Chromium found: the report's charts are checked by rendering them. Install the Debian package "
        "`chromium` (apt-get install chromium; CI installs it) or point DITTO_CHROMIUM at a Chromium binary.");
  if (::access(chromium.c_str(), X_OK) != 0) FAIL("DITTO_CHROMIUM=" << chromium << " is not an executable file");
  static int run = 0;
  const std::string profile = test::scratch("cpu_report", fmt::format("chromium-profile-{}", run++));
  const std::string log = profile + ".log";
  // A profile folder of its own: no state from (or into) the user's browser; the timeout keeps a
  // hung browser from hanging the test suite.
  const std::string command = fmt::format(
      "timeout 120 {} --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run "
      "--user-data-dir={} --dump-dom {} 2>{}",
      shell_quote(chromium), shell_quote(profile),
      shell_quote("file://" + std::filesystem::absolute(html_path).string()), shell_quote(log));
  std::FILE* pipe = ::popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::string dom;
  char buffer[4096];
  for (std::size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;) dom.append(buffer, n);
  const int status = ::pclose(pipe);
  INFO("command: " << command);
  INFO("chromium stderr (" << log << "):\n" << read_text(log).substr(0, 4000));
  REQUIRE(status == 0);
  REQUIRE(!dom.empty());
  return dom;
}

// The text the page's check script wrote into <pre id="chart-check"> (or another id).
std::string chart_check(const std::string& dom, const std::string& id = "chart-check") {
  const std::string open = "<pre id=\"" + id + "\">";
  const std::size_t at = dom.find(open);
  REQUIRE(at != std::string::npos);
  const std::size_t end = dom.find("</pre>", at);
  REQUIRE(end != std::string::npos);
  return dom.substr(at + open.size(), end - at - open.size());
}

std::string title_of(const std::string& dom) {
  const std::size_t at = dom.find("<title>"), end = dom.find("</title>");
  REQUIRE((at != std::string::npos && end != std::string::npos));
  return dom.substr(at + 7, end - at - 7);
}

// Replaces the n-th (0-based) <svg class="chart">...</svg> of the page with `replacement`.
std::string replace_chart(const std::string& html, int n, const std::string& replacement) {
  std::size_t at = 0;
  for (int i = 0; i <= n; ++i) {
    at = html.find("<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\"", i ? at + 1 : 0);
    REQUIRE(at != std::string::npos);
  }
  const std::size_t end = html.find("</svg>", at);
  REQUIRE(end != std::string::npos);
  return html.substr(0, at) + replacement + html.substr(end + 6);
}

}  // namespace

TEST_CASE("report.csv: header, hand-given values and intervals, quoting", "[report]") {
  const std::string dir = test::scratch("cpu_report", "csv");
  write_report(dir, full_report());
  const std::string csv = read_text(dir + "/report.csv");
  CHECK(csv == report_csv(full_report()));
  CHECK(csv.rfind("setting,metric,value,ci_low,ci_high\n", 0) == 0);
  // 7 metrics, 3 class + 6 subgroup spreads, 2 curves x 4 epochs per setting; 15 figure-S4
  // points (12 cells and 3 CONTROL); 2 x 7 decomposition terms.
  CHECK(count_occurrences(csv, "\n") == 1 + 3 * (7 + 9 + 8) + 15 + 14);

  CHECK(has_line(csv, fmt::format("ALGO+IMPL,churn,0.0912,{},{}", 0.0912 * 0.9, 0.0912 * 1.1)));
  CHECK(has_line(csv, "CONTROL,churn,0,,"));  // no interval: empty cells
  CHECK(has_line(csv, "ALGO,disagreement,0.175,,"));
  CHECK(has_line(csv, fmt::format("ALGO,accuracy_std,0.0055,{},{}", 0.0055 * 0.5, 0.0055 * 1.5)));
  CHECK(has_line(csv, fmt::format("ALGO,weight_l2,0.000125,{},{}", 0.000125 * 0.8, 0.000125 * 1.2)));
  CHECK(has_line(csv, "CONTROL,seconds_per_epoch,4.5,,"));
  CHECK(has_line(csv, "ALGO+IMPL,subgroup:Blond_Hair=1 & Male=0:fpr_std,0.01,,"));
  CHECK(has_line(csv, fmt::format("ALGO,\"class:ship, \"\"big\"\":accuracy_std\",{},,", 0.02 + 0.001 * 2)));
  CHECK(has_line(csv, fmt::format("ALGO+IMPL,top1@epoch2,{},{},{}", 0.4 + 0.05 * 2, 0.4 + 0.05 * 2 - 0.02,
                                  0.4 + 0.05 * 2 + 0.02)));
  CHECK(has_line(csv, fmt::format("CONTROL,top5@epoch4,{},{},{}", 0.8 + 0.05 * 4, 0.8 + 0.05 * 4, 0.8 + 0.05 * 4)));
  CHECK(has_line(csv, fmt::format("fixed-init/random-order,disagreement@lr0.001,{},,", 0.05 + 0.02 + 1e-3)));
  CHECK(has_line(csv, fmt::format("random-init/fixed-order,disagreement@lr0.0001,{},,", 0.1 + 0.0 + 1e-4)));
  CHECK(has_line(csv, "CONTROL,disagreement@lr0.01,0,,"));
  CHECK(has_line(csv, "decomposition:churn,interaction,-0.0273,-0.029,-0.0256"));
  CHECK(has_line(csv, "decomposition:accuracy_variance,ALGO+IMPL,3.7e-05,1e-05,6e-05"));
}

TEST_CASE("report.json: every section, numbers round-trip exactly", "[report]") {
  const std::string dir = test::scratch("cpu_report", "json");
  const ReportData d = full_report();
  write_report(dir, d);
  const json j = json::parse(read_text(dir + "/report.json"));
  CHECK(j["title"] == d.title);
  CHECK(j["settings"] == json(kSettings));
  REQUIRE(j["metrics"].size() == d.metrics.size());
  for (std::size_t i = 0; i < d.metrics.size(); ++i) {
    CHECK(j["metrics"][i]["setting"] == d.metrics[i].setting);
    CHECK(j["metrics"][i]["metric"] == d.metrics[i].metric);
    CHECK(j["metrics"][i]["value"].get<double>() == d.metrics[i].value);
    CHECK(j["metrics"][i]["low"].get<double>() == d.metrics[i].low);
    CHECK(j["metrics"][i]["high"].get<double>() == d.metrics[i].high);
    CHECK(j["metrics"][i]["has_interval"] == d.metrics[i].has_interval);
  }
  REQUIRE(j["curves"].size() == 6);
  CHECK(j["curves"][1]["metric"] == "top5");
  CHECK(j["curves"][1]["epochs"] == json({1, 2, 3, 4}));
  CHECK(j["curves"][1]["high"][3].get<double>() == d.curves[1].high[3]);
  REQUIRE(j["groups"].size() == d.groups.size());
  CHECK(j["groups"][3]["group"] == "Blond_Hair=1 & Male=0");
  CHECK(j["groups"][3]["kind"] == "subgroup");
  CHECK(j["groups"][3]["mean"].get<double>() == 0.3);
  CHECK(j["groups"][3]["std"].get<double>() == d.groups[3].std);
  CHECK(j["stability"][0]["counts"] == json({0, 91, 909}));
  CHECK(j["unstable"][1]["index"] == 4242);
  CHECK(j["unstable"][1]["label"] == "ship, \"big\"");
  CHECK(j["unstable"][1]["agree"] == 2);
  CHECK(j["unstable"][1]["replicas"] == 3);
  CHECK(j["unstable"][1]["predicted"] == json({"ship, \"big\"", "cat", "ship, \"big\""}));
  // The image travels with the report: base64 of the JPEG, whose FF D8 FF start reads "/9j/".
  CHECK(j["unstable"][1]["jpeg_base64"] == base64_encode(d.unstable[1].jpeg));
  CHECK(j["unstable"][1]["jpeg_base64"].get<std::string>().rfind("/9j/", 0) == 0);
  REQUIRE(j["fig_s4"].size() == 15);
  CHECK(j["fig_s4"][4]["lr"].get<double>() == 1e-3);
  CHECK(j["fig_s4"][4]["order"] == "random");
  CHECK(j["fig_s4"][4]["kernels"] == "heuristic");
  CHECK(j["fig_s4"][4]["line"] == "fixed-init/random-order");
  CHECK(j["fig_s4"][4]["disagreement"].get<double>() == d.fig_s4[4].disagreement);
  CHECK(j["fig_s4"][14]["line"] == "CONTROL");
  CHECK(j["fig_s4"][14]["kernels"] == "deterministic");
  REQUIRE(j["decomposition"].size() == 2);
  CHECK(j["decomposition"][0]["measure"] == "churn");
  CHECK(j["decomposition"][0]["verdict"] == "sub-additive");
  CHECK(j["decomposition"][0]["terms"][6]["name"] == "interaction");
  CHECK(j["decomposition"][0]["terms"][6]["low"].get<double>() == -0.029);
  CHECK(j["overhead"][1]["ratio"].get<double>() == 1.25);
  CHECK(j["manifest"] == d.manifest);
}

TEST_CASE("report.html: one chart per filled section, names escaped, nothing external", "[report]") {
  const std::string dir = test::scratch("cpu_report", "html");
  write_report(dir, full_report());
  const std::string html = read_text(dir + "/report.html");
  CHECK(html == report_html(full_report()));
  CHECK(count_occurrences(html, "<svg ") == kFullCharts);
  CHECK(count_occurrences(html, "class=\"chart\"") == kFullCharts);
  for (const char* id :
       {"summary", "spread", "curves", "groups", "decomposition", "stability", "fig-s4", "overhead", "manifest"})
    CHECK(html.find(fmt::format("<section id=\"{}\">", id)) != std::string::npos);

  CHECK(html.find("<title>smallcnn &lt;test&gt; &amp; cifar10: 3 replicas x 4 epochs</title>") != std::string::npos);
  CHECK(html.find("Blond_Hair=1 &amp; Male=0") != std::string::npos);
  CHECK(html.find("Blond_Hair=1 & Male=0") == std::string::npos);
  CHECK(html.find("ship, &quot;big&quot;") != std::string::npos);
  CHECK(html.find("<th>ALGO+IMPL</th>") != std::string::npos);
  // Summary cells: value [low, high] with an interval, the value alone without.
  CHECK(html.find(">0.0912 [0.08208, 0.1003]<") != std::string::npos);
  CHECK(html.find(">0.175<") != std::string::npos);
  // Weight distances five decades apart are drawn on the log axis.
  CHECK(html.find(">1e-4<") != std::string::npos);
  CHECK(html.find(">1e2<") != std::string::npos);
  // Figure S4 is one line per init x order combination; the legend names them.
  for (const char* line :
       {"fixed-init/fixed-order", "fixed-init/random-order", "random-init/fixed-order", "random-init/random-order"})
    CHECK(html.find(line) != std::string::npos);
  // Figure S4's CONTROL line is drawn and named.
  CHECK(html.find(">CONTROL<") != std::string::npos);
  CHECK(html.find("zero line") != std::string::npos);
  // The decomposition: every term, and the verdict in words.
  CHECK(html.find(">-0.0273 [-0.029, -0.0256]<") != std::string::npos);
  CHECK(html.find("sub-additive: together") != std::string::npos);
  CHECK(html.find("consistent with additive") != std::string::npos);
  // Least stable examples as images with their labels and every replica's prediction (the
  // wrong ones marked), and the manifest's kernels, per setting in a <details>.
  CHECK(count_occurrences(html, "<img class=\"example\"") == kFullImages);
  CHECK(html.find("<img class=\"example\" src=\"data:image/jpeg;base64," + base64_encode(thumbnail(2))) !=
        std::string::npos);
  CHECK(html.find("#4242 <b>ship, &quot;big&quot;</b>") != std::string::npos);
  CHECK(html.find("predicted: ship, &quot;big&quot;, <span class=\"wrong\">cat</span>, ship") != std::string::npos);
  CHECK(count_occurrences(html, "kernel choices</summary>") == 3);
  CHECK(html.find("conv1.bwd_filter=algo0") != std::string::npos);
  CHECK(html.find("NVIDIA H100 80GB HBM3") != std::string::npos);
  CHECK(html.find("ditto-experiment --replicas 3 --out runs/x") != std::string::npos);
  // Self-contained: no linked stylesheets, scripts, images or fonts; the images are inline.
  for (const char* external : {"<link", " href=", "url(", "@import"})
    CHECK(html.find(external) == std::string::npos);
  CHECK(count_occurrences(html, " src=") == count_occurrences(html, " src=\"data:image/jpeg;base64,"));
  CHECK(html.find("<pre id=\"chart-check\">") != std::string::npos);
  CHECK(html.find("<pre id=\"image-check\">") != std::string::npos);
}

TEST_CASE("report.html: sections without data are left out", "[report]") {
  ReportData d;
  d.title = "only churn";
  d.settings = {"ALGO", "CONTROL"};
  d.metrics = {{"ALGO", "churn", 0.1, 0.08, 0.12, true}, {"CONTROL", "churn", 0, 0, 0, false}};
  const std::string html = report_html(d);
  CHECK(count_occurrences(html, "class=\"chart\"") == 1);
  CHECK(html.find("no divergence") != std::string::npos);  // CONTROL's zero churn is named, not an empty bar
  for (const char* id : {"curves", "groups", "decomposition", "stability", "fig-s4", "overhead", "manifest"})
    CHECK(html.find(fmt::format("<section id=\"{}\">", id)) == std::string::npos);

  const std::string nothing = report_html(ReportData{});
  CHECK(count_occurrences(nothing, "class=\"chart\"") == 0);
  CHECK(nothing.find("<section") == std::string::npos);
  CHECK(report_csv(ReportData{}) == "setting,metric,value,ci_low,ci_high\n");
}

TEST_CASE("report: non-finite weights are shown as such; bad curves and folders are errors", "[report]") {
  ReportData d;
  d.settings = {"ALGO"};
  d.metrics = {{"ALGO", "weight_l2", std::nan(""), 0, 0, false}};
  CHECK(report_html(d).find("not finite") != std::string::npos);

  ReportData curve;
  curve.curves = {{"ALGO", "top1", {1, 2}, {0.5, std::numeric_limits<double>::infinity()}, {}, {}}};
  CHECK_THROWS_AS(report_html(curve), Error);
  curve.curves = {{"ALGO", "top1", {1, 2}, {0.5}, {}, {}}};
  CHECK_THROWS_AS(report_csv(curve), Error);

  // A folder that cannot be made (its parent is a file): IoError naming the folder.
  const std::string file = test::scratch("cpu_report", "a_file");
  { std::ofstream(file) << "x"; }
  try {
    write_report(file + "/report", full_report());
    FAIL("write_report into a folder under a file did not throw");
  } catch (const IoError& e) {
    CHECK(std::string(e.what()).find(file + "/report") != std::string::npos);
  }
}

TEST_CASE("svg_line_chart, svg_grouped_bar_chart, svg_histogram: structure, escaping, errors", "[svg]") {
  std::vector<LineSeries> lines = {{"a & b", {1, 2, 3}, {0.5, 0.6, 0.7}, {0.4, 0.5, 0.6}, {0.6, 0.7, 0.8}, ""},
                                   {"one point", {2}, {0.55}, {}, {}, "#123456"}};
  std::string svg = svg_line_chart("t <1>", "epoch", "top-1", lines);
  CHECK(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\"", 0) == 0);
  CHECK(svg.find("t &lt;1&gt;") != std::string::npos);
  CHECK(svg.find("a &amp; b") != std::string::npos);
  CHECK(count_occurrences(svg, "<polyline") == 1);              // the one-point series has no line...
  CHECK(count_occurrences(svg, "<circle") == 4);                // ...but a dot, like every point
  CHECK(count_occurrences(svg, "fill-opacity=\"0.18\"") == 1);  // one band
  CHECK(svg.find("#123456") != std::string::npos);
  CHECK(svg.find(">2.5<") == std::string::npos);  // integer x (epochs): integer ticks
  CHECK(count_occurrences(svg, "<text") == count_occurrences(svg, "</text>"));

  const std::string log =
      svg_line_chart("lr", "lr", "d", {{"s", {1e-4, 1e-3, 3e-2}, {0.1, 0.2, 0.3}, {}, {}, ""}}, true);
  for (const char* tick : {">0.0001<", ">0.001<", ">0.01<", ">0.1<"}) CHECK(log.find(tick) != std::string::npos);
  CHECK_THROWS_AS(svg_line_chart("t", "x", "y", {{"s", {0, 1}, {1, 2}, {}, {}, ""}}, true), Error);
  CHECK_THROWS_AS(svg_line_chart("t", "x", "y", {{"s", {1, 2}, {1, std::nan("")}, {}, {}, ""}}), Error);
  CHECK_THROWS_AS(svg_line_chart("t", "x", "y", {{"s", {1, 2}, {1}, {}, {}, ""}}), Error);
  CHECK_THROWS_AS(svg_line_chart("t", "x", "y", {{"s", {1, 2}, {1, 2}, {1}, {2, 3}, ""}}), Error);

  std::vector<BarSeries> bars = {{"ALGO+IMPL", {0.02, 0.0}, ""}, {"CONTROL", {std::nullopt, 0.01}, ""}};
  svg = svg_grouped_bar_chart("g", "std", {"Blond_Hair=1 & Male=0", "cat"}, bars);
  CHECK(svg.find("class=\"chart\"") != std::string::npos);
  CHECK(svg.find("Blond_Hair=1 &amp; Male=0") != std::string::npos);
  CHECK(svg.find(">n/a<") != std::string::npos);
  CHECK(count_occurrences(svg, "<rect") == 2 + 2);  // two non-zero bars, two legend swatches
  CHECK(svg.find(chart_color(0)) != std::string::npos);
  CHECK(svg.find(chart_color(1)) != std::string::npos);
  CHECK_THROWS_AS(svg_grouped_bar_chart("g", "x", {"a"}, {{"s", {-1.0}, ""}}), Error);
  CHECK_THROWS_AS(svg_grouped_bar_chart("g", "x", {"a", "b"}, {{"s", {1.0}, ""}}), Error);

  svg = svg_histogram("h & h", "k", "examples", {{"1", 0}, {"2", 91}, {"3", 909}});
  CHECK(svg.find("class=\"chart\"") != std::string::npos);
  CHECK(svg.find("h &amp; h") != std::string::npos);
  CHECK(count_occurrences(svg, "<rect") == 2);
  CHECK(svg.find(">909<") != std::string::npos);
  CHECK(svg.find(">1000<") != std::string::npos);  // the y axis covers the largest count
  CHECK_THROWS_AS(svg_histogram("h", "k", "n", {{"1", std::numeric_limits<double>::infinity()}}), Error);
  // Heat map: a cell per positive value (zero and missing cells stay white), 40 colour-bar bands,
  // the range in powers of ten, labels escaped.
  svg = svg_heat_map("where <runs> part", "step", {"conv1", "layer1.0 & bn"}, {1, 2, 3},
                     {{0.0, 1e-7, 1e-3}, {std::nullopt, 2e-5, 0.5}});
  CHECK(svg.find("class=\"chart\"") != std::string::npos);
  CHECK(svg.find("layer1.0 &amp; bn") != std::string::npos);
  CHECK(count_occurrences(svg, "<rect") == 4 + 1 + 40);  // cells, the frame, the colour bar
  CHECK(svg.find(">1e-7<") != std::string::npos);
  CHECK(svg.find(">1e0<") != std::string::npos);
  CHECK_THROWS_AS(svg_heat_map("h", "x", {"a"}, {1, 2}, {{1.0}}), Error);
  CHECK_THROWS_AS(svg_heat_map("h", "x", {"a"}, {1}, {{-1.0}}), Error);
  CHECK_THROWS_AS(svg_heat_map("h", "x", {"a", "b"}, {1}, {{1.0}}), Error);
  CHECK_THROWS_AS(svg_histogram("h", "k", "n", {{"1", -1}}), Error);

  // The bar charts carry the class too, so a report checks them like the others.
  CHECK(svg_bar_chart("b", "x", {{"r", 1}}).find("class=\"chart\"") != std::string::npos);
  CHECK(svg_log_bar_chart("b", "x", {{"r", 1}}).find("class=\"chart\"") != std::string::npos);
  CHECK_THROWS_AS(svg_log_bar_chart("b", "x", {{"r", 1, 0.5, std::nan(""), true, ""}}), Error);
}

TEST_CASE("report.html in headless Chromium: every chart draws something", "[report][chromium]") {
  const std::string dir = test::scratch("cpu_report", "chromium");
  write_report(dir, full_report());
  const std::string dom = rendered_dom(dir + "/report.html");
  const std::string expected = fmt::format("charts={} empty=0", kFullCharts);
  CHECK(chart_check(dom) == expected);
  CHECK(title_of(dom).find(expected) != std::string::npos);
  // Every least stable example's image decoded to a picture.
  const std::string images = fmt::format("images={} broken=0", kFullImages);
  CHECK(chart_check(dom, "image-check") == images);
  CHECK(title_of(dom).find(images) != std::string::npos);

  // A one-chart report passes too.
  ReportData small;
  small.settings = {"ALGO"};
  small.metrics = {{"ALGO", "churn", 0.1, 0.08, 0.12, true}};
  const std::string small_dir = test::scratch("cpu_report", "chromium_small");
  write_report(small_dir, small);
  const std::string small_dom = rendered_dom(small_dir + "/report.html");
  CHECK(chart_check(small_dom) == "charts=1 empty=0");
  CHECK(chart_check(small_dom, "image-check") == "images=0 broken=0");
}

TEST_CASE("report.html in headless Chromium: an emptied or corrupt example image is caught", "[report][chromium]") {
  // One image's data emptied, another's replaced by bytes that are not a JPEG: both must count
  // as broken, so that the check above can fail; the charts are untouched.
  const std::string prefix = "src=\"data:image/jpeg;base64,";
  std::string html = report_html(full_report());
  const std::size_t first = html.find(prefix);
  REQUIRE(first != std::string::npos);
  const std::size_t first_end = html.find('"', first + prefix.size());
  html = html.substr(0, first + prefix.size()) + html.substr(first_end);
  const std::size_t second = html.find(prefix, first + prefix.size());
  REQUIRE(second != std::string::npos);
  const std::size_t second_end = html.find('"', second + prefix.size());
  html = html.substr(0, second + prefix.size()) + base64_encode({'n', 'o', 't', ' ', 'a', ' ', 'j', 'p', 'e', 'g'}) +
         html.substr(second_end);
  const std::string path = test::scratch("cpu_report", "emptied-image.html");
  write_file_atomic(path, html);
  const std::string dom = rendered_dom(path);
  CHECK(chart_check(dom, "image-check") == fmt::format("images={} broken=2", kFullImages));
  CHECK(count_occurrences(dom, "data-broken=\"true\"") == 2);
  CHECK(chart_check(dom) == fmt::format("charts={} empty=0", kFullCharts));
}

TEST_CASE("base64_encode: RFC 4648's test vectors", "[report]") {
  auto b64 = [](const std::string& s) { return base64_encode(std::vector<uint8_t>(s.begin(), s.end())); };
  CHECK(b64("") == "");
  CHECK(b64("f") == "Zg==");
  CHECK(b64("fo") == "Zm8=");
  CHECK(b64("foo") == "Zm9v");
  CHECK(b64("foob") == "Zm9vYg==");
  CHECK(b64("fooba") == "Zm9vYmE=");
  CHECK(b64("foobar") == "Zm9vYmFy");
  CHECK(base64_encode({0xFF, 0xD8, 0xFF, 0xE0}) == "/9j/4A==");  // every bit set in places: no sign trouble
}

TEST_CASE("report.html: an example without an image is listed without one", "[report]") {
  ReportData d;
  d.settings = {"ALGO"};
  d.unstable = {{"ALGO", 5, "cat", 1, 2, {"cat", "dog"}, {}}};
  const std::string html = report_html(d);
  CHECK(html.find("(no image)") != std::string::npos);
  CHECK(html.find("<img") == std::string::npos);
  CHECK(html.find("Example images shown (0 expected)") != std::string::npos);
}

TEST_CASE("report.html in headless Chromium: an empty chart is caught", "[report][chromium]") {
  // The full page with one chart emptied and another reduced to its title: both must count as
  // empty, so that the check above can fail.
  std::string html = report_html(full_report());
  html = replace_chart(html, 0,
                       "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" width=\"900\" height=\"100\"></svg>");
  html = replace_chart(html, 5,
                       "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" width=\"900\" height=\"100\">"
                       "<text x=\"450\" y=\"24\">only a title</text><rect x=\"10\" y=\"10\" width=\"0\" height=\"40\"/>"
                       "</svg>");
  const std::string path = test::scratch("cpu_report", "emptied.html");
  write_file_atomic(path, html);
  const std::string dom = rendered_dom(path);
  CHECK(chart_check(dom) == fmt::format("charts={} empty=2", kFullCharts));
  CHECK(count_occurrences(dom, "data-empty=\"true\"") == 2);
}
