// Epoch order, augmentation and the Loader on the CPU: permutations replay, augmentation
// replays and matches a direct recomputation, and batches are bit-identical for any number of
// worker threads.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <set>

#include "datasets/dataset.h"
#include "datasets/loader.h"
#include "engine/context.h"
#include "engine/error.h"

using namespace ditto;

TEST_CASE("epoch_permutation: a permutation, replayable, different per epoch and seed") {
  for (int64_t n : {0, 1, 2, 7, 1000}) {
    auto p = epoch_permutation(n, 42, 3);
    auto sorted = p;
    std::sort(sorted.begin(), sorted.end());
    for (int64_t i = 0; i < n; ++i) CHECK(sorted[i] == i);
    CHECK(p == epoch_permutation(n, 42, 3));
  }
  auto a = epoch_permutation(1000, 42, 0);
  CHECK(a != epoch_permutation(1000, 42, 1));
  CHECK(a != epoch_permutation(1000, 43, 0));
  // Not the identity and roughly uniform: position of element 0 over many epochs covers the range.
  std::set<int64_t> where;
  for (int e = 0; e < 200; ++e) {
    auto p = epoch_permutation(10, 5, e);
    where.insert(std::find(p.begin(), p.end(), 0) - p.begin());
  }
  CHECK(where.size() == 10);
  CHECK_THROWS_AS(epoch_permutation(-1, 0, 0), Error);
}

TEST_CASE("augment_draw: replays, covers the crop range and both flips, keyed by every input") {
  std::set<int> dxs, dys;
  int flips = 0;
  for (int64_t i = 0; i < 2000; ++i) {
    AugmentDraw d = augment_draw(9, 2, i, 4, true);
    CHECK(d == augment_draw(9, 2, i, 4, true));
    CHECK(d.dx >= 0);
    CHECK(d.dx <= 8);
    CHECK(d.dy >= 0);
    CHECK(d.dy <= 8);
    dxs.insert(d.dx);
    dys.insert(d.dy);
    flips += d.flip;
  }
  CHECK(dxs.size() == 9);
  CHECK(dys.size() == 9);
  CHECK(flips > 850);
  CHECK(flips < 1150);
  int same_epoch = 0, same_seed = 0;
  for (int64_t i = 0; i < 200; ++i) {
    same_epoch += augment_draw(9, 2, i, 4, true) == augment_draw(9, 3, i, 4, true);
    same_seed += augment_draw(9, 2, i, 4, true) == augment_draw(10, 2, i, 4, true);
    CHECK_FALSE(augment_draw(9, 2, i, 4, false).flip);
  }
  CHECK(same_epoch < 20);  // 1/162 chance of a coincidence each
  CHECK(same_seed < 20);
}

TEST_CASE("augment_image: matches an explicit pad-crop-flip") {
  Dataset ds = make_synthetic(1, 2, 3, 9, 11, 4);
  const int c = 3, h = 9, w = 11, pad = 4;
  for (int64_t i = 0; i < 50; ++i) {
    AugmentDraw d = augment_draw(1, 0, i, pad, true);
    std::vector<uint8_t> got(c * h * w);
    augment_image(ds.image(0), c, h, w, pad, d, got.data());
    // Build the padded image, crop it, then flip the crop.
    const int ph = h + 2 * pad, pw = w + 2 * pad;
    std::vector<uint8_t> padded(c * ph * pw, 0);
    for (int ch = 0; ch < c; ++ch)
      for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) padded[(ch * ph + y + pad) * pw + x + pad] = ds.image(0)[(ch * h + y) * w + x];
    std::vector<uint8_t> want(c * h * w);
    for (int ch = 0; ch < c; ++ch)
      for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) {
          uint8_t v = padded[(ch * ph + y + d.dy) * pw + x + d.dx];
          want[(ch * h + y) * w + (d.flip ? w - 1 - x : x)] = v;
        }
    CHECK(got == want);
  }
  // The centre crop without flip is the identity.
  std::vector<uint8_t> same(c * h * w);
  augment_image(ds.image(0), c, h, w, pad, AugmentDraw{pad, pad, false}, same.data());
  CHECK(std::equal(same.begin(), same.end(), ds.image(0)));
}

TEST_CASE("standardize_image: tf.image.per_image_standardization") {
  Dataset ds = make_synthetic(1, 2, 3, 8, 8, 4);
  std::vector<float> out(192);
  standardize_image(ds.image(0), 192, out.data());
  double m = 0, s = 0;
  for (float v : out) m += v;
  m /= 192;
  for (float v : out) s += (v - m) * (v - m);
  CHECK(std::fabs(m) < 1e-6);
  CHECK(std::sqrt(s / 192) == Approx(1.0).epsilon(1e-5));
  // A constant image: std 0 is floored at 1/sqrt(numel), so the output is exactly 0.
  std::vector<uint8_t> flat(192, 77);
  standardize_image(flat.data(), 192, out.data());
  CHECK(std::all_of(out.begin(), out.end(), [](float v) { return v == 0.0f; }));
  // Two values: x in {0, 1/255} half each, std = 0.5/255 < 1/sqrt(192): floored.
  for (int k = 0; k < 192; ++k) flat[k] = k % 2;
  standardize_image(flat.data(), 192, out.data());
  CHECK(out[1] == Approx((1 / 255.0 - 0.5 / 255.0) * std::sqrt(192.0)).epsilon(1e-6));
  CHECK(out[0] == -out[1]);
}

namespace {
struct Collected {
  std::vector<Fingerprint> image_prints, label_prints;
  std::vector<std::vector<int64_t>> indices;
  std::vector<int64_t> rows;
};

Collected run_epochs(Context& ctx, const Dataset& ds, LoaderOptions opts, std::vector<int> epochs) {
  Loader loader(ctx, ds, opts);
  Collected c;
  for (int e : epochs) {
    loader.start_epoch(e);
    Batch b;
    int64_t count = 0;
    while (loader.next(b)) {
      c.image_prints.push_back(b.images.fingerprint());
      c.label_prints.push_back(b.labels.fingerprint());
      c.indices.push_back(b.indices);
      c.rows.push_back(b.images.dim(0));
      ++count;
    }
    CHECK(count == loader.batches_per_epoch());
    CHECK_FALSE(loader.next(b));
  }
  return c;
}
}  // namespace

TEST_CASE("Loader: batches match a direct recomputation of order, augmentation and normalization") {
  Context ctx;
  Dataset ds = make_synthetic(37, 5, 3, 12, 10, 11);
  LoaderOptions o;
  o.batch_size = 8;
  o.seed_order = 3;
  o.seed_augment = 4;
  o.augment = true;
  o.mean = {0.5f, 0.4f, 0.3f};
  o.std = {0.25f, 0.2f, 0.3f};
  o.threads = 3;
  Loader loader(ctx, ds, o);
  CHECK(loader.batches_per_epoch() == 5);
  loader.start_epoch(2);
  const auto perm = epoch_permutation(37, 3, 2);
  CHECK(loader.order() == perm);
  Batch b;
  int64_t pos = 0;
  while (loader.next(b)) {
    const int64_t rows = b.images.dim(0);
    CHECK(b.images.shape() == Shape{rows, 3, 12, 10});
    CHECK(b.labels.shape() == Shape{rows});
    CHECK(b.images.device() == Device::cpu());
    auto img = b.images.to_host_f32();
    auto lab = b.labels.to_host_i32();
    for (int64_t r = 0; r < rows; ++r, ++pos) {
      const int64_t idx = perm[pos];
      CHECK(b.indices[r] == idx);
      CHECK(lab[r] == ds.labels[idx]);
      AugmentDraw d = augment_draw(4, 2, idx, 4, true);
      std::vector<uint8_t> aug(360);
      augment_image(ds.image(idx), 3, 12, 10, 4, d, aug.data());
      bool all_equal = true;
      for (int k = 0; k < 360; ++k) {
        const int c = k / 120;
        const float want = static_cast<float>((aug[k] / 255.0 - o.mean[c]) / o.std[c]);
        all_equal = all_equal && img[r * 360 + k] == want;
      }
      CHECK(all_equal);
    }
  }
  CHECK(pos == 37);  // last batch has 5 rows
}

TEST_CASE("Loader: bit-identical batches for 0, 1 and several worker threads, and on replay") {
  Context ctx;
  Dataset ds = make_synthetic(203, 10, 3, 16, 16, 5);
  for (bool standardize : {false, true}) {
    LoaderOptions o;
    o.batch_size = 16;
    o.seed_order = 77;
    o.seed_augment = 78;
    o.augment = true;
    o.standardize = standardize;
    if (!standardize) {
      ChannelStats st = ds.channel_stats();
      o.mean = st.mean;
      o.std = st.std;
    }
    o.threads = 1;
    Collected one = run_epochs(ctx, ds, o, {0, 1, 0});
    REQUIRE(one.image_prints.size() == 3 * 13);
    CHECK(one.rows.back() == 203 - 12 * 16);
    // Epoch 0 replays after epoch 1; epoch 1 differs.
    CHECK(std::equal(one.image_prints.begin(), one.image_prints.begin() + 13, one.image_prints.begin() + 26));
    CHECK(one.image_prints[0] != one.image_prints[13]);
    for (int threads : {0, 2, 4, 7}) {
      INFO("threads " << threads << " standardize " << standardize);
      o.threads = threads;
      Collected many = run_epochs(ctx, ds, o, {0, 1, 0});
      CHECK(many.image_prints == one.image_prints);
      CHECK(many.label_prints == one.label_prints);
      CHECK(many.indices == one.indices);
    }
  }
}

TEST_CASE("Loader: order without shuffle, drop_last, restart mid-epoch, option errors") {
  Context ctx;
  Dataset ds = make_synthetic(10, 2, 1, 4, 4, 1);
  LoaderOptions o;
  o.batch_size = 4;
  o.shuffle = false;
  o.drop_last = true;
  Loader loader(ctx, ds, o);
  CHECK(loader.batches_per_epoch() == 2);
  Batch b;
  CHECK_THROWS_AS(loader.next(b), Error);
  loader.start_epoch(0);
  REQUIRE(loader.next(b));
  CHECK(b.indices == std::vector<int64_t>{0, 1, 2, 3});
  // No augmentation, no normalization: pixel / 255 exactly as float.
  auto img = b.images.to_host_f32();
  CHECK(img[17] == static_cast<float>(ds.image(1)[1] / 255.0));
  // Restarting in the middle of an epoch starts over.
  loader.start_epoch(0);
  REQUIRE(loader.next(b));
  CHECK(b.indices == std::vector<int64_t>{0, 1, 2, 3});
  REQUIRE(loader.next(b));
  CHECK_FALSE(loader.next(b));
  // A batch larger than the dataset with drop_last: no batches.
  o.batch_size = 11;
  Loader none(ctx, ds, o);
  CHECK(none.batches_per_epoch() == 0);
  o.batch_size = 0;
  CHECK_THROWS_AS(Loader(ctx, ds, o), Error);
  o.batch_size = 4;
  o.mean = {0.5f, 0.5f};
  o.std = {1.f, 1.f};
  CHECK_THROWS_AS(Loader(ctx, ds, o), Error);  // 2 values for 1 channel
  o.mean = {0.5f};
  o.std = {0.f};
  CHECK_THROWS_AS(Loader(ctx, ds, o), Error);
  o.std = {1.f};
  o.standardize = true;
  CHECK_THROWS_AS(Loader(ctx, ds, o), Error);  // exclusive
}
