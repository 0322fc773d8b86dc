// stream_loader: images per second of the streaming image loader (datasets/stream.h), per worker
// thread and in all, for the training transform (random-resized-crop + flip) and the evaluation
// one (resize + centre crop), with and without DCT-scaled decoding. A benchmark, not a test: it
// measures and writes what it measured.
//
// Without --data it first writes a folder of JPEGs of ImageNet-like sizes (shorter side 300 to
// 500, aspect 3:4 to 16:9, quality 90, smooth pictures with noise) under --work. Per
// configuration: one untimed epoch prefix (--warmup batches), then --batches batches timed by
// wall clock on a CPU context (the decode, crop and normalization the workers do; no device
// copy). images/s per thread = images/s / max(1, threads): on a machine with at least that many
// free cores it is images/s per core. The batches' fingerprint is printed per configuration: it
// must not depend on the thread count (the program exits 1 when it does).
//   stream_loader --threads 1,2,4,8 --batches 20 --out runs/stream_loader
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "datasets/dataset.h"
#include "datasets/loader.h"
#include "datasets/stream.h"
#include "engine/context.h"
#include "engine/error.h"
#include "engine/manifest.h"
#include "engine/philox.h"

using namespace ditto;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

void write_folder(const std::string& root, int images, int classes) {
  for (int i = 0; i < images; ++i) {
    const Philox4x32 r = philox4x32(uint64_t(i), 0, 0x5eedull);
    const int shorter = 300 + int(r.v[0] % 201);
    const double aspect = 0.75 + (r.v[1] % 1000) / 1000.0 * (16.0 / 9.0 - 0.75);
    const bool wide = (r.v[2] & 1) != 0;
    const int h = wide ? shorter : int(std::lround(shorter * aspect));
    const int w = wide ? int(std::lround(shorter * aspect)) : shorter;
    std::vector<uint8_t> px(static_cast<std::size_t>(3) * h * w);
    for (int c = 0; c < 3; ++c)
      for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) {
          const double v = 128 + 90 * std::sin(0.02 * (i % 7 + 1) * x + 0.03 * y + c) +
                           double(philox4x32(uint64_t(y) * w + x, uint64_t(c), uint64_t(i)).v[0] & 31);
          px[(static_cast<std::size_t>(c) * h + y) * w + x] = static_cast<uint8_t>(std::min(255.0, std::max(0.0, v)));
        }
    const auto bytes = encode_jpeg(px.data(), 3, h, w, 90);
    const fs::path p = fs::path(root) / "train" / fmt::format("class{}", i % classes) / fmt::format("{:06}.jpg", i);
    fs::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  }
}

struct Options {
  std::string data, work = "runs/stream_loader_data", out = "runs/stream_loader", split = "train";
  std::vector<int> threads = {1, 2, 4};
  int batches = 10, warmup = 2, batch = 64, size = 224, resize = 256, images = 768;
};

void add_options(CLI::App& app, Options& o) {
  app.add_option("--data", o.data, "an image folder root (<root>/<split>/<class>/*.jpg); default: generate one");
  app.add_option("--split", o.split, "the split folder under --data")->capture_default_str();
  app.add_option("--work", o.work, "where the generated folder goes")->capture_default_str();
  app.add_option("--images", o.images, "generated images")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--threads", o.threads, "worker thread counts to measure")->delimiter(',')->capture_default_str();
  app.add_option("--batches", o.batches, "timed batches per configuration")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--warmup", o.warmup, "untimed batches first")->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--batch-size", o.batch)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--size", o.size, "output side")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--resize", o.resize, "evaluation: shorter side before the centre crop")->capture_default_str();
  app.add_option("--out", o.out, "folder for stream_loader.csv and stream_loader.json")->capture_default_str();
}

// --data, or the generated folder under --work (written when its split is not there yet).
std::string image_root(const Options& o) {
  if (!o.data.empty()) return o.data;
  if (!fs::exists(fs::path(o.work) / o.split)) {
    std::fprintf(stderr, "writing %d JPEGs under %s\n", o.images, o.work.c_str());
    write_folder(o.work, o.images, 10);
  }
  return o.work;
}

// One configuration's timed batches: images, seconds and the fingerprint of the batches in order.
struct Timed {
  int64_t n = 0;
  double s = 0;
  std::string fingerprint;
};

Timed time_loader(const Options& o, const Dataset& ds, const StreamTransform& t, bool train, int threads) {
  Context ctx;
  LoaderOptions lo;
  lo.batch_size = o.batch;
  lo.seed_order = 1;
  lo.seed_augment = 2;
  lo.augment = train;
  lo.mean = t.mean;
  lo.std = t.std;
  lo.threads = threads;
  Loader loader(ctx, ds, lo);
  loader.start_epoch(0);
  Batch b;
  Hasher fp;
  for (int k = 0; k < o.warmup; ++k) loader.next(b);
  const auto t0 = std::chrono::steady_clock::now();
  Timed r;
  for (int k = 0; k < o.batches && loader.next(b); ++k) {
    r.n += b.labels.numel();
    fp.add(b.images.fingerprint());
  }
  r.s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.fingerprint = fp.digest().hex();
  return r;
}

// The rows measured so far, as CSV and JSON, and whether every thread count of a configuration
// gave the same batches.
struct Results {
  json rows = json::array();
  std::string csv = "transform,dct_scaling,threads,batch_size,images,seconds,images_per_s,images_per_s_per_thread,"
                    "fingerprint\n";
  bool consistent = true;

  void add(const char* name, bool dct, int th, int batch, const Timed& m) {
    const double rate = m.n / m.s;
    std::printf("%-5s dct=%-3s threads=%-2d %8.1f images/s  %7.1f per thread  fingerprint %s\n", name,
                dct ? "on" : "off", th, rate, rate / std::max(1, th), m.fingerprint.c_str());
    std::fflush(stdout);
    csv += fmt::format("{},{},{},{},{},{:.4f},{:.2f},{:.2f},{}\n", name, dct ? "on" : "off", th, batch, m.n, m.s, rate,
                       rate / std::max(1, th), m.fingerprint);
    rows.push_back({{"transform", name}, {"dct_scaling", dct}, {"threads", th}, {"batch_size", batch},
                    {"images", m.n}, {"seconds", m.s}, {"images_per_s", rate},
                    {"images_per_s_per_thread", rate / std::max(1, th)}, {"fingerprint", m.fingerprint}});
  }
};

// One transform (train or eval) with DCT scaling on or off, at every --threads count.
void measure_configuration(const Options& o, const std::string& root, bool train, bool dct, Results& results) {
  StreamTransform t;
  t.size = o.size;
  t.resize = o.resize;
  t.dct_scaling = dct;
  const Dataset ds = stream_image_folder(root, o.split, t);
  const int64_t need = int64_t(o.warmup + o.batches) * o.batch;
  if (ds.n < need) throw Error(fmt::format("--batches/--warmup: {} images needed, the folder has {}", need, ds.n));
  std::string first_fp;
  for (int th : o.threads) {
    const Timed m = time_loader(o, ds, t, train, th);
    if (first_fp.empty()) first_fp = m.fingerprint;
    results.consistent = results.consistent && m.fingerprint == first_fp;
    results.add(train ? "train" : "eval", dct, th, o.batch, m);
  }
}

void write_results(const Options& o, const std::string& root, const Results& results) {
  json doc{{"tool", "stream_loader"},
           {"data", root},
           {"size", o.size},
           {"resize", o.resize},
           {"hardware_concurrency", std::thread::hardware_concurrency()},
           {"rows", results.rows}};
  write_file_atomic((fs::path(o.out) / "stream_loader.csv").string(), results.csv);
  write_file_atomic((fs::path(o.out) / "stream_loader.json").string(), doc.dump(2));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"stream_loader: images/s of the streaming JPEG loader, per thread"};
  Options o;
  add_options(app, o);
  CLI11_PARSE(app, argc, argv);
  try {
    const std::string root = image_root(o);
    fs::create_directories(o.out);
    Results results;
    for (const bool train : {true, false})
      for (const bool dct : {true, false}) measure_configuration(o, root, train, dct, results);
    write_results(o, root, results);
    if (!results.consistent) {
      std::fprintf(stderr, "stream_loader: the batches' fingerprint changed with the thread count\n");
      return 1;
    }
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "stream_loader: %s\n", e.what());
    return 2;
  }
}
