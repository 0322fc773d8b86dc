// ditto-knobs: every choice that can change bits, as the op families declare them (engine/knob.h).
//   ditto-knobs                      one block per knob: variants, guarantees, what each mode picks
//   ditto-knobs --markdown           the table README.md shows
//   ditto-knobs --update README.md   rewrite README's table in place (between its knob-table markers)
#include <cstdio>
#include <fstream>
#include <sstream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "ditto/ditto.h"

namespace {

const char* kBegin = "<!-- registry:knobs begin (ditto-knobs --update README.md) -->\n";
const char* kEnd = "<!-- registry:knobs end -->\n";

void print_blocks() {
  for (const ditto::KnobSpec& k : ditto::knobs()) {
    fmt::print("{}.{}: {}\n", k.op.name, k.name, k.summary);
    for (std::size_t i = 0; i < k.variants.size(); ++i) {
      const auto& v = k.variants[i];
      fmt::print("  {:<24} {:<15} {:<8} {}\n", v.name, ditto::guarantee_name(v.guarantee),
                 v.impl == ditto::Impl::Ditto ? "ditto" : "library", v.summary);
    }
    if (k.selected_at_run_time) {
      fmt::print("  modes: selected per shape by the op\n");
    } else {
      auto pick = [&](ditto::SelectMode m) { return k.variants[k.mode_pick(m)].name; };
      fmt::print("  modes: heuristic {}, deterministic {}, nondeterministic {}, fastest {}, pytorch {}\n",
                 pick(ditto::SelectMode::Heuristic), pick(ditto::SelectMode::Deterministic),
                 pick(ditto::SelectMode::Nondeterministic), pick(ditto::SelectMode::Fastest),
                 pick(ditto::SelectMode::Pytorch));
    }
  }
}

// Replaces the text between the markers with the registry's table; an error names the file when
// it has no markers. Written atomically, so the file is never half-written.
void update(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ditto::IoError(fmt::format("{}: cannot open", path));
  std::stringstream buf;
  buf << in.rdbuf();
  const std::string text = buf.str();
  const auto b = text.find(kBegin), e = text.find(kEnd);
  if (b == std::string::npos || e == std::string::npos || e < b)
    throw ditto::Error(fmt::format("{}: no knob-table markers ({} ... {})", path, kBegin, kEnd));
  const std::string updated =
      text.substr(0, b + std::string(kBegin).size()) + ditto::knob_table_markdown() + text.substr(e);
  ditto::write_file_atomic(path, updated);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ditto-knobs: the knobs, their variants and guarantees, and what each mode picks"};
  bool markdown = false;
  std::string readme;
  auto* md = app.add_flag("--markdown", markdown, "print the Markdown table README.md shows");
  app.add_option("--update", readme, "rewrite the knob table of this Markdown file in place")->excludes(md);
  CLI11_PARSE(app, argc, argv);
  try {
    if (!readme.empty()) update(readme);
    else if (markdown) std::fputs(ditto::knob_table_markdown().c_str(), stdout);
    else print_blocks();
  } catch (const ditto::Error& e) {
    std::fprintf(stderr, "ditto-knobs: %s\n", e.what());
    return 1;
  }
  return 0;
}
