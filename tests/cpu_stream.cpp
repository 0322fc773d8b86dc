// The streaming image loader (datasets/stream.h) on generated folders of JPEGs of varied sizes:
// listing as load_image_folder lists; the evaluation transform bitwise load_image_folder's resize
// and centre crop; training batches bit-identical for any number of worker threads and for sharded
// loaders; the random-resized-crop draws within their ranges and replayable; DCT-scaled decoding
// close to full decoding; corrupt files named; the Dataset's streamed bookkeeping.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <set>

#include "datasets/dataset.h"
#include "datasets/loader.h"
#include "datasets/stream.h"
#include "engine/context.h"
#include "engine/error.h"
#include "engine/philox.h"
#include "train_support.h"

using namespace ditto;
namespace fs = std::filesystem;

namespace {

// A smooth, class-dependent picture (JPEG-friendly) of h x w with some per-image noise.
std::vector<uint8_t> picture(int h, int w, int label, uint64_t seed) {
  std::vector<uint8_t> px(static_cast<std::size_t>(3) * h * w);
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x) {
        const uint32_t noise = philox4x32(uint64_t(y) * w + x, c, seed).v[0] & 15;
        const double v = 128 + 100 * std::sin(0.07 * (label + 1) * x + 0.05 * y + c) + noise;
        px[(static_cast<std::size_t>(c) * h + y) * w + x] = static_cast<uint8_t>(std::clamp(v, 0.0, 255.0));
      }
  return px;
}

void write_jpeg(const fs::path& p, int h, int w, int label, uint64_t seed) {
  fs::create_directories(p.parent_path());
  const auto bytes = encode_jpeg(picture(h, w, label, seed).data(), 3, h, w, 92);
  std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

// root/train/<class>/*.jpg: 3 classes, 21 images from 37x52 to 300x170.
std::string make_jpeg_folder(const std::string& name) {
  const std::string root = test::scratch("stream", name);
  const int sizes[][2] = {{37, 52}, {64, 64}, {120, 90}, {300, 170}, {48, 200}, {96, 41}, {133, 133}};
  int k = 0;
  for (int label = 0; label < 3; ++label)
    for (const auto& s : sizes)
      write_jpeg(fs::path(root) / "train" / ("class" + std::to_string(label)) / ("img" + std::to_string(k++) + ".jpg"),
                 s[0], s[1], label, 1000 + k);
  return root;
}

std::vector<float> all_batches(const Dataset& ds, LoaderOptions o, int epoch, std::vector<int64_t>* indices = nullptr) {
  Context ctx;
  Loader loader(ctx, ds, o);
  loader.start_epoch(epoch);
  Batch b;
  std::vector<float> out;
  while (loader.next(b)) {
    auto v = b.images.to_host_f32();
    out.insert(out.end(), v.begin(), v.end());
    if (indices) indices->insert(indices->end(), b.indices.begin(), b.indices.end());
  }
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("stream folder: lists like load_image_folder; evaluation is its resize and centre crop, bit for bit") {
  const std::string root = make_jpeg_folder("eval");
  StreamTransform t;
  t.size = 32;
  t.resize = 40;
  t.dct_scaling = false;
  const Dataset s = stream_image_folder(root, "train", t);
  const Dataset m = load_image_folder(root, "train", ImageGeometry{40, 32});
  CHECK(s.streamed());
  CHECK(s.n == 21);
  CHECK(s.labels == m.labels);
  CHECK(s.class_names == m.class_names);
  CHECK(s.channels == 3);
  CHECK(s.height == 32);
  CHECK(s.width == 32);
  CHECK_THROWS_AS(s.image(0), Error);
  LoaderOptions o;
  o.batch_size = 5;
  o.shuffle = false;
  o.threads = 2;
  CHECK(same_bits(all_batches(s, o, 0), all_batches(m, o, 0)));
  // The thumbnails' view is the same picture.
  const auto thumb = s.source->eval_image(7);
  CHECK(std::equal(thumb.begin(), thumb.end(), m.image(7)));
}

TEST_CASE("stream folder: training batches are the same bits for 0, 1 and 4 threads and for sharded loaders") {
  const std::string root = make_jpeg_folder("train");
  StreamTransform t;
  t.size = 24;
  t.resize = 28;
  const Dataset s = stream_image_folder(root, "train", t);
  LoaderOptions o;
  o.batch_size = 6;
  o.seed_order = 3;
  o.seed_augment = 4;
  o.augment = true;
  o.mean = t.mean;
  o.std = t.std;
  o.threads = 0;
  std::vector<int64_t> idx0;
  const auto ref = all_batches(s, o, 2, &idx0);
  for (int threads : {1, 4}) {
    o.threads = threads;
    std::vector<int64_t> idx;
    CHECK(same_bits(all_batches(s, o, 2, &idx), ref));
    CHECK(idx == idx0);
  }
  // Another epoch draws other crops.
  CHECK_FALSE(same_bits(all_batches(s, o, 3), ref));
  // Two shards together are the whole.
  std::vector<float> joined;
  {
    Context ctx;
    LoaderOptions a = o, b = o;
    a.shards = b.shards = 2;
    b.shard = 1;
    Loader la(ctx, s, a), lb(ctx, s, b);
    la.start_epoch(2);
    lb.start_epoch(2);
    Batch ba, bb;
    while (la.next(ba)) {
      REQUIRE(lb.next(bb));
      for (const Batch* p : {&ba, &bb}) {
        auto v = p->images.to_host_f32();
        joined.insert(joined.end(), v.begin(), v.end());
      }
    }
  }
  CHECK(same_bits(joined, ref));
  // Normalized with the transform's mean and std: roughly centred values.
  double sum = 0;
  for (float v : ref) sum += v;
  CHECK(std::fabs(sum / ref.size()) < 2.0);
}

TEST_CASE("random resized crop: boxes inside the image, areas and ratios in range, replayable, keyed") {
  StreamTransform t;
  std::set<int> xs;
  int flips = 0, fallback = 0;
  for (int64_t i = 0; i < 2000; ++i) {
    const int h = 50 + int(i % 200), w = 60 + int((i * 7) % 300);
    const CropBox b = random_resized_crop(9, 1, i, h, w, t, true);
    CHECK(b == random_resized_crop(9, 1, i, h, w, t, true));
    CHECK(b.y >= 0);
    CHECK(b.x >= 0);
    CHECK(b.h >= 1);
    CHECK(b.w >= 1);
    CHECK(b.y + b.h <= h);
    CHECK(b.x + b.w <= w);
    if (b.draws <= 10) {
      // Rounding the sides moves area and ratio by at most about a pixel's worth.
      const double area = double(b.h) * b.w / (double(h) * w), ratio = double(b.w) / b.h;
      CHECK(area >= t.scale_min * 0.8);
      CHECK(area <= 1.0);
      CHECK(ratio >= t.ratio_min * (1 - 2.0 / b.h) - 1e-9);
      CHECK(ratio <= t.ratio_max * (1 + 2.0 / b.h) + 1e-9);
    } else {
      ++fallback;
    }
    xs.insert(b.x);
    flips += b.flip;
    CHECK_FALSE(random_resized_crop(9, 1, i, h, w, t, false).flip);
  }
  CHECK(xs.size() > 100);
  CHECK(flips > 850);
  CHECK(flips < 1150);
  CHECK(fallback < 100);  // elongated images (50 x 300) leave the ten draws few boxes that fit
  int same_epoch = 0, same_seed = 0;
  for (int64_t i = 0; i < 200; ++i) {
    same_epoch += random_resized_crop(9, 1, i, 300, 300, t, true) == random_resized_crop(9, 2, i, 300, 300, t, true);
    same_seed += random_resized_crop(9, 1, i, 300, 300, t, true) == random_resized_crop(10, 1, i, 300, 300, t, true);
  }
  CHECK(same_epoch < 5);
  CHECK(same_seed < 5);
  // A sliver no box of the ratio range fits: torchvision's centre fallback.
  StreamTransform tight = t;
  tight.scale_min = 0.9;
  const CropBox f = random_resized_crop(1, 0, 0, 10, 1000, tight, false);
  CHECK(f.draws == 11);
  CHECK(f.h == 10);
  CHECK(f.w == std::lround(10 * tight.ratio_max));
  CHECK(f.x == (1000 - f.w) / 2);
}

TEST_CASE("stream folder: DCT-scaled decoding is close to full decoding") {
  const std::string root = test::scratch("stream", "large");
  write_jpeg(fs::path(root) / "a" / "big.jpg", 640, 480, 0, 5);
  write_jpeg(fs::path(root) / "b" / "big.jpg", 480, 720, 1, 6);
  StreamTransform t;
  t.size = 56;
  t.resize = 64;  // crops cover 4x to 8x the output: decoded at 1/4 or 1/8
  const Dataset fast = stream_image_folder(root, "", t);
  t.dct_scaling = false;
  const Dataset full = stream_image_folder(root, "", t);
  CHECK(fast.fingerprint() != full.fingerprint());  // the transform is part of the fingerprint
  for (int64_t i = 0; i < 2; ++i) {
    const auto a = fast.source->eval_image(i), b = full.source->eval_image(i);
    REQUIRE(a.size() == b.size());
    double diff = 0;
    for (std::size_t k = 0; k < a.size(); ++k) diff += std::abs(int(a[k]) - int(b[k]));
    CHECK(diff / a.size() < 8.0);  // the same picture; smooth content differs by a few levels
    CHECK(a == fast.source->eval_image(i));  // and deterministic
  }
}

TEST_CASE("stream folder: the fingerprint covers the files' contents, not only their names and sizes") {
  const std::string root = make_jpeg_folder("contents");
  const fs::path a = fs::path(root) / "train" / "class0" / "img1.jpg", b = fs::path(root) / "train" / "class1" / "img8.jpg";
  auto slurp = [](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), {});
  };
  auto put = [](const fs::path& p, const std::string& bytes) { std::ofstream(p, std::ios::binary) << bytes; };
  // Two files of one size in two classes (a decoder stops at the end-of-image marker, so zeros
  // after it pad the smaller one), then their contents swapped: the same paths and sizes.
  std::string x = slurp(a), y = slurp(b);
  REQUIRE(x != y);
  const std::size_t n = std::max(x.size(), y.size());
  x.resize(n, '\0');
  y.resize(n, '\0');
  put(a, x);
  put(b, y);
  StreamTransform t;
  t.size = 16;
  t.resize = 20;
  const Fingerprint listed = stream_image_folder(root, "train", t).fingerprint();
  CHECK(stream_image_folder(root, "train", t).fingerprint() == listed);
  put(a, y);
  put(b, x);
  CHECK(stream_image_folder(root, "train", t).fingerprint() != listed);
  // One file replaced by other bytes of the same size.
  put(a, x);
  put(b, y);
  REQUIRE(stream_image_folder(root, "train", t).fingerprint() == listed);
  std::string z = x;
  z[z.size() / 2] = static_cast<char>(z[z.size() / 2] ^ 0x10);
  put(a, z);
  CHECK(stream_image_folder(root, "train", t).fingerprint() != listed);
}

TEST_CASE("stream folder: corrupt files, bad transforms, and the data set's bookkeeping") {
  const std::string root = make_jpeg_folder("bad");
  StreamTransform t;
  t.size = 16;
  t.resize = 20;
  Dataset s = stream_image_folder(root, "train", t);
  // statistics, fingerprint, take_first
  CHECK(s.channel_stats().mean == t.mean);
  CHECK(s.channel_stats().std == t.std);
  const Dataset head = take_first(s, 5);
  CHECK(head.n == 5);
  CHECK(head.source->size() == 5);
  CHECK(head.fingerprint() != s.fingerprint());
  CHECK(s.summary().find("21 examples") != std::string::npos);
  // A file that changes size changes the fingerprint.
  const Fingerprint before = s.fingerprint();
  const fs::path victim = fs::path(root) / "train" / "class1" / "img8.jpg";
  const auto size = fs::file_size(victim);
  fs::resize_file(victim, size / 2);
  const Dataset changed = stream_image_folder(root, "train", t);
  CHECK(changed.fingerprint() != before);
  // The truncated file is named when its batch is made (here on a worker thread).
  LoaderOptions o;
  o.batch_size = 4;
  o.shuffle = false;
  o.threads = 2;
  const std::string msg = test::error_of([&] { all_batches(changed, o, 0); });
  CHECK(msg.find("img8.jpg") != std::string::npos);
  CHECK(msg.find("corrupt JPEG") != std::string::npos);
  // Transforms out of range.
  using Change = std::function<void(StreamTransform&)>;
  for (const Change& bad : std::vector<Change>{[](StreamTransform& x) { x.size = 0; },
                                               [](StreamTransform& x) { x.resize = x.size - 1; },
                                               [](StreamTransform& x) { x.scale_min = 0; },
                                               [](StreamTransform& x) { x.scale_max = 1.5; },
                                               [](StreamTransform& x) { x.ratio_min = 2; },
                                               [](StreamTransform& x) { x.std = {1, 0, 1}; },
                                               [](StreamTransform& x) { x.mean = {0.5f}; }}) {
    StreamTransform x = t;
    bad(x);
    CHECK_THROWS_AS(stream_image_folder(root, "train", x), Error);
  }
  CHECK_THROWS_AS(stream_image_folder(root, "nosuch", t), IoError);
}
