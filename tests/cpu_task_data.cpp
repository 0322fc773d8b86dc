// The data of the other task kinds (datasets/dataset.h, datasets/digits.cpp): the procedural digits,
// the segmentation masks, the rotated / translated digits, the digit strings, the categorical
// attributes (synthetic and CelebA's), their checks, and what the loader hands a step.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "datasets/dataset.h"
#include "datasets/loader.h"
#include "engine/context.h"
#include "engine/error.h"
#include "train_support.h"

using namespace ditto;
namespace fs = std::filesystem;

namespace {

int64_t ink_pixels(const Dataset& d, int64_t i) {
  const uint8_t* p = d.image(i);
  return std::count_if(p, p + d.image_numel(), [](uint8_t v) { return v >= kInkThreshold; });
}

// Digits whose image j is filled with j + 1 in columns 2..25 (so a string's pixels say which
// image they came from), label j % 10.
Dataset id_digits(int count) {
  Dataset d;
  d.name = "id-digits";
  d.n = count;
  d.channels = 1;
  d.height = d.width = 28;
  d.num_classes = 10;
  for (int k = 0; k < 10; ++k) d.class_names.push_back(std::to_string(k));
  d.images.assign(static_cast<std::size_t>(count) * 28 * 28, 0);
  for (int j = 0; j < count; ++j) {
    d.labels.push_back(j % 10);
    for (int y = 0; y < 28; ++y)
      for (int x = 2; x < 26; ++x) d.images[static_cast<std::size_t>(j) * 784 + y * 28 + x] = static_cast<uint8_t>(j + 1);
  }
  d.validate();
  return d;
}

}  // namespace

TEST_CASE("task data: procedural digits are MNIST-shaped, deterministic, and differ by seed") {
  const Dataset a = make_synthetic_digits(30, 4), b = make_synthetic_digits(30, 4), c = make_synthetic_digits(30, 5);
  CHECK(a.channels == 1);
  CHECK(a.height == 28);
  CHECK(a.width == 28);
  CHECK(a.num_classes == 10);
  CHECK(a.task == Task::Classification);
  for (int64_t i = 0; i < a.n; ++i) {
    CHECK(a.labels[i] == i % 10);
    CHECK(ink_pixels(a, i) > 20);  // every glyph has strokes
    CHECK(a.image(i)[0] == 0);     // and a black corner, as MNIST
  }
  CHECK(a.fingerprint() == b.fingerprint());
  CHECK(a.images == b.images);
  CHECK(a.images != c.images);
  // a 1 lights two segments, an 8 seven: more ink
  CHECK(ink_pixels(a, 8) > 2 * ink_pixels(a, 1));
}

TEST_CASE("task data: segmentation masks label each digit's ink pixels with its class") {
  const Dataset digits = make_synthetic_digits(20, 1);
  const Dataset seg = make_digit_segmentation(digits);
  CHECK(seg.task == Task::Segmentation);
  CHECK(seg.num_classes == 11);
  CHECK(seg.class_names.front() == "background");
  CHECK(seg.class_names.back() == "9");
  CHECK(seg.target_length == 28 * 28);
  CHECK(seg.images == digits.images);
  for (int64_t i = 0; i < seg.n; ++i) {
    CHECK(seg.labels[i] == digits.labels[i] + 1);
    for (int p = 0; p < seg.target_length; ++p)
      REQUIRE(seg.target(i)[p] == (digits.image(i)[p] >= kInkThreshold ? digits.labels[i] + 1 : 0));
  }
  // another threshold, other masks; the fingerprint sees targets
  const Dataset low = make_digit_segmentation(digits, 20);
  CHECK(low.targets != seg.targets);
  CHECK(low.fingerprint() != seg.fingerprint());
  CHECK(digits.fingerprint() != seg.fingerprint());
  CHECK_THROWS_AS(make_digit_segmentation(digits, 0), Error);
  CHECK_THROWS_AS(make_digit_segmentation(make_synthetic(4, 10, 3, 28, 28, 1)), DataError);  // 3 channels
}

TEST_CASE("task data: rotated and translated digits keep labels, move ink, replay by seed") {
  const Dataset digits = make_synthetic_digits(20, 2);
  const Dataset rt = make_rotated_translated(digits, 40, 45, 7);
  CHECK(rt.height == 40);
  CHECK(rt.width == 40);
  CHECK(rt.labels == digits.labels);
  CHECK(rt.task == Task::Classification);
  CHECK(make_rotated_translated(digits, 40, 45, 7).images == rt.images);
  CHECK(make_rotated_translated(digits, 40, 45, 8).images != rt.images);
  // Bilinear rotation moves ink rather than making or losing it (within the rounding of each pixel
  // and the faint corners a 45-degree turn may push off the canvas).
  for (int64_t i = 0; i < digits.n; ++i) {
    double src = 0, dst = 0;
    for (int64_t k = 0; k < digits.image_numel(); ++k) src += digits.image(i)[k];
    for (int64_t k = 0; k < rt.image_numel(); ++k) dst += rt.image(i)[k];
    CHECK(dst == Approx(src).epsilon(0.08));
  }
  // No rotation on a canvas of the digit's own size is the identity, exactly.
  CHECK(make_rotated_translated(digits, 28, 0, 3).images == digits.images);
  CHECK_THROWS_AS(make_rotated_translated(digits, 20, 45, 1), Error);
}

TEST_CASE("task data: digit strings paste their digits in order, lengths 1..3, targets padded with 0") {
  const Dataset src = id_digits(250);
  const Dataset s = make_digit_strings(src, 200, 3, 11);
  CHECK(s.task == Task::Sequence);
  CHECK(s.height == 28);
  CHECK(s.width == 72);
  CHECK(s.num_classes == 11);
  CHECK(s.class_names.front() == "blank");
  CHECK(s.target_length == 3);
  std::set<int> lengths;
  int whole = 0;  // examples whose every digit shows as a run of its own
  for (int64_t i = 0; i < s.n; ++i) {
    const int len = s.sequence_length(i);
    lengths.insert(len);
    REQUIRE(s.labels[i] == len);
    for (int k = 0; k < 3; ++k) CHECK((k < len ? s.target(i)[k] >= 1 && s.target(i)[k] <= 10 : s.target(i)[k] == 0));
    // Row 14 read left to right: the source images' fills in order (an overlap shows the larger of
    // two neighbours, which is one of them); each source's label + 1 is the target there.
    std::vector<int> runs;
    for (int x = 0; x < s.width; ++x) {
      const int v = s.image(i)[14 * s.width + x];
      if (v && (runs.empty() || runs.back() != v)) runs.push_back(v);
    }
    // The same image drawn twice in a row shows as one run: compare with repeats merged, and ask
    // that this is rare.
    std::vector<int> seen, want;
    for (int v : runs)
      if (seen.empty() || seen.back() != (v - 1) % 10 + 1) seen.push_back((v - 1) % 10 + 1);
    for (int k = 0; k < len; ++k)
      if (want.empty() || want.back() != s.target(i)[k]) want.push_back(s.target(i)[k]);
    CHECK(seen == want);
    whole += static_cast<int>(runs.size()) == len;
  }
  CHECK(whole > 190);
  CHECK(lengths == std::set<int>{1, 2, 3});
  const auto per_length = s.class_counts();
  CHECK(s.summary().find(fmt::format("(examples per length: 1:{} 2:{} 3:{})", per_length[1], per_length[2],
                                     per_length[3])) != std::string::npos);
  CHECK(s.summary().find("sequence targets (3 per example") != std::string::npos);
  const Dataset again = make_digit_strings(src, 200, 3, 11), other = make_digit_strings(src, 200, 3, 12);
  CHECK(again.fingerprint() == s.fingerprint());
  CHECK(other.fingerprint() != s.fingerprint());
  CHECK_THROWS_AS(make_digit_strings(make_rotated_translated(src, 40, 0, 1), 4, 3, 1), DataError);  // 40x40
  CHECK_THROWS_AS(make_digit_strings(src, 4, 10, 1), Error);
}

TEST_CASE("task data: synthetic attributes are categorical ids with a learnable, noisy label") {
  const Dataset a = make_synthetic_attributes(4000, kCelebAFields, 3);
  CHECK(a.categories == 2 * kCelebAFields);
  CHECK(a.channels == 1);
  CHECK(a.height == 1);
  CHECK(a.width == kCelebAFields);
  CHECK(a.num_classes == 2);
  int64_t positive = 0, agree = 0;
  const double w[] = {1.5, -1.2, 1.0, -0.8, 0.6, -0.4, 0.3, -0.2};
  for (int64_t i = 0; i < a.n; ++i) {
    double score = 0;
    for (int j = 0; j < a.width; ++j) {
      const int id = a.image(i)[j];
      REQUIRE((id == 2 * j || id == 2 * j + 1));
      if (j < 8) score += w[j] * (2 * (id - 2 * j) - 1);
    }
    positive += a.labels[i];
    agree += (score > 0) == (a.labels[i] == 1);
  }
  CHECK(positive > a.n / 5);
  CHECK(positive < 4 * a.n / 5);
  CHECK(agree > 0.75 * a.n);  // the label follows the score ...
  CHECK(agree < a.n);         // ... but not always: no classifier reaches 100%
  CHECK(make_synthetic_attributes(4000, kCelebAFields, 3).images == a.images);
  CHECK(make_synthetic_attributes(4000, kCelebAFields, 4).images != a.images);
}

TEST_CASE("task data: CelebA's attributes as categorical fields, without the images") {
  const fs::path root = test::scratch("task_data", "celeba");
  fs::create_directories(root);
  {
    std::ofstream attr(root / "list_attr_celeba.txt");
    attr << "4\nBlond_Hair Male Smiling\n";
    attr << "000001.jpg 1 -1 1\n000002.jpg -1 1 -1\n000003.jpg -1 -1 1\n000004.jpg 1 1 1\n";
    std::ofstream part(root / "list_eval_partition.txt");
    part << "000001.jpg 0\n000002.jpg 0\n000003.jpg 2\n000004.jpg 2\n";
  }
  CelebAOptions o;
  o.label_attribute = "Male";
  o.subgroup_attributes = {"Smiling"};
  const Dataset tr = load_celeba_attributes(root.string(), Split::Train, o);
  CHECK(tr.n == 2);
  CHECK(tr.width == 2);  // Blond_Hair and Smiling
  CHECK(tr.categories == 4);
  CHECK(tr.labels == std::vector<int32_t>{0, 1});
  CHECK(tr.images == std::vector<uint8_t>{1, 3, 0, 2});  // (Blond 1, Smiling 1), (Blond 0, Smiling 0)
  CHECK(tr.subgroups == std::vector<int32_t>{1, 0});
  CHECK(tr.class_names == std::vector<std::string>{"Male=0", "Male=1"});
  const Dataset te = load_celeba_attributes(root.string(), Split::Test, o);
  CHECK(te.images == std::vector<uint8_t>{0, 3, 1, 3});
  CHECK(te.labels == std::vector<int32_t>{0, 1});
  o.label_attribute = "Bald";
  CHECK_THROWS_WITH(load_celeba_attributes(root.string(), Split::Train, o), Catch::Contains("Bald"));
}

TEST_CASE("task data: validate catches targets that do not fit the task") {
  Dataset s = make_digit_strings(make_synthetic_digits(10, 1), 6, 3, 1);
  s.validate();
  Dataset bad = s;
  bad.targets[0] = 11;  // past the symbols
  CHECK_THROWS_AS(bad.validate(), DataError);
  bad = s;
  bad.targets[1] = 0;  // a hole before a symbol, or a length that is not the label
  bad.targets[2] = bad.targets[2] ? bad.targets[2] : 3;
  CHECK_THROWS_AS(bad.validate(), DataError);
  bad = s;
  bad.targets.pop_back();
  CHECK_THROWS_AS(bad.validate(), DataError);
  Dataset seg = make_digit_segmentation(make_synthetic_digits(4, 1));
  seg.targets[5] = -1;
  CHECK_THROWS_AS(seg.validate(), DataError);
  Dataset cat = make_synthetic_attributes(4, 3, 1);
  cat.images[1] = 6;  // categories are 0..5
  CHECK_THROWS_AS(cat.validate(), DataError);
  Dataset cls = make_synthetic(4, 3, 1, 8, 8, 1);
  cls.targets = {1};
  CHECK_THROWS_AS(cls.validate(), DataError);
  // take_first keeps the targets of the examples it keeps
  const Dataset first = take_first(s, 2);
  CHECK(first.task == Task::Sequence);
  CHECK(first.targets == std::vector<int32_t>(s.targets.begin(), s.targets.begin() + 6));
}

TEST_CASE("task data: the loader hands a step its targets, lengths and category ids") {
  Context cpu;
  LoaderOptions lo;
  lo.batch_size = 4;
  lo.shuffle = false;
  lo.threads = 1;
  const Dataset seg = make_digit_segmentation(make_synthetic_digits(6, 1));
  Loader sl(cpu, seg, lo);
  sl.start_epoch(0);
  Batch b;
  REQUIRE(sl.next(b));
  CHECK(b.targets.shape() == Shape{4, 28, 28});
  CHECK(!b.target_lengths.defined());
  auto t = b.targets.to_host_i32();
  CHECK(std::equal(t.begin(), t.end(), seg.targets.begin()));

  const Dataset str = make_digit_strings(make_synthetic_digits(6, 1), 6, 3, 1);
  Loader ql(cpu, str, lo);
  ql.start_epoch(0);
  REQUIRE(ql.next(b));
  REQUIRE(ql.next(b));  // the partial batch of 2
  CHECK(b.targets.shape() == Shape{2, 3});
  CHECK(b.target_lengths.to_host_i32() == std::vector<int32_t>{str.labels[4], str.labels[5]});

  const Dataset cat = make_synthetic_attributes(6, 5, 1);
  Loader cl(cpu, cat, lo);
  cl.start_epoch(0);
  REQUIRE(cl.next(b));
  CHECK(b.images.dtype() == DType::I32);
  CHECK(b.images.shape() == Shape{4, 5});
  auto ids = b.images.to_host_i32();
  CHECK(std::equal(ids.begin(), ids.end(), cat.images.begin()));

  LoaderOptions aug = lo;
  aug.augment = true;
  CHECK_THROWS_WITH(Loader(cpu, seg, aug), Catch::Contains("augmentation"));
  LoaderOptions norm = lo;
  norm.mean = {0.5f};
  norm.std = {0.5f};
  CHECK_THROWS_WITH(Loader(cpu, cat, norm), Catch::Contains("category ids"));
}
