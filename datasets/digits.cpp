// Datasets derived from digit images, for the segmentation, spatial-transformer and CTC networks,
// the procedural digits that stand in for MNIST where no files are at hand, and the categorical
// attributes of the embedding-bag model (see dataset.h). Every generator draws from Philox keyed by
// (seed, example index) in a stream of its own and computes in double, so its output is a pure
// function of its inputs.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <cmath>

#include "datasets/dataset.h"
#include "engine/error.h"
#include "engine/philox.h"

namespace ditto {

namespace {
constexpr double kPi = 3.14159265358979323846;
// Uniform in [0, 1) with 32 random bits, in double.
inline double unit(uint32_t bits) { return bits * (1.0 / 4294967296.0); }
// Uniform integer in [0, range) (bias below range / 2^32).
inline int64_t below(uint32_t bits, int64_t range) { return static_cast<int64_t>((uint64_t(bits) * uint64_t(range)) >> 32); }
inline uint8_t to_byte(double v) { return static_cast<uint8_t>(std::clamp(std::lround(v), 0L, 255L)); }

// Streams of their own, so no generator's draws move another's.
constexpr uint64_t kDigitsStream = 0x6469676974ull;        // "digit"
constexpr uint64_t kRotateStream = 0x726f74617465ull;      // "rotate"
constexpr uint64_t kStringsStream = 0x737472696e67ull;     // "string"
constexpr uint64_t kAttributesStream = 0x6174747273ull;    // "attrs"

std::vector<std::string> digit_names() {
  std::vector<std::string> n;
  for (int k = 0; k < 10; ++k) n.push_back(std::to_string(k));
  return n;
}

// 11 names: what class 0 is, then the digits.
std::vector<std::string> with_digits(const std::string& first) {
  std::vector<std::string> n = {first};
  for (const auto& d : digit_names()) n.push_back(d);
  return n;
}

void require_digits(const Dataset& d, const char* what, bool size_28) {
  if (d.channels != 1 || d.num_classes != 10 || d.task != Task::Classification || d.categories != 0 ||
      (size_28 && (d.height != 28 || d.width != 28)))
    throw DataError(fmt::format("{}: '{}' is not a set of digit images (1 channel{}, 10 classes, classification); it "
                                "is {}x{}x{}, {} classes",
                                what, d.name, size_28 ? ", 28x28" : "", d.channels, d.height, d.width, d.num_classes));
}

// Distance from (px, py) to the segment (ax, ay)-(bx, by).
double segment_distance(double px, double py, double ax, double ay, double bx, double by) {
  const double vx = bx - ax, vy = by - ay, wx = px - ax, wy = py - ay;
  const double len2 = vx * vx + vy * vy;
  const double t = len2 > 0 ? std::clamp((wx * vx + wy * vy) / len2, 0.0, 1.0) : 0.0;
  const double dx = wx - t * vx, dy = wy - t * vy;
  return std::sqrt(dx * dx + dy * dy);
}

}  // namespace

Dataset make_synthetic_digits(int64_t n, uint64_t seed) {
  if (n < 0) throw Error(fmt::format("make_synthetic_digits: n = {} < 0", n));
  // Segments a (top), b (top right), c (bottom right), d (bottom), e (bottom left), f (top left),
  // g (middle), as a seven-segment display lights them for each digit.
  static const std::array<const char*, 10> lit = {"abcdef", "bc", "abdeg", "abcdg", "bcfg",
                                                  "acdfg",  "acdefg", "abc", "abcdefg", "abcdfg"};
  Dataset ds;
  ds.name = fmt::format("synthetic-digits-seed{}", seed);
  ds.n = n;
  ds.channels = 1;
  ds.height = ds.width = 28;
  ds.num_classes = 10;
  ds.class_names = digit_names();
  ds.images.assign(static_cast<std::size_t>(n) * 28 * 28, 0);
  ds.labels.resize(static_cast<std::size_t>(n));
  const uint64_t key = mix_key(seed, kDigitsStream);
  for (int64_t i = 0; i < n; ++i) {
    const int k = static_cast<int>(i % 10);
    ds.labels[i] = k;
    const Philox4x32 r0 = philox4x32(uint64_t(i), 0, key), r1 = philox4x32(uint64_t(i), 1, key);
    const double w = 10 + 4 * unit(r0.v[0]), h = 16 + 4 * unit(r0.v[1]);
    const double cx = 13.5 + (unit(r0.v[2]) - 0.5) * 4, cy = 13.5 + (unit(r0.v[3]) - 0.5) * 4;
    const double thick = 2 + 1.5 * unit(r1.v[0]), slant = (unit(r1.v[1]) - 0.5) * 0.5;
    const double ink = 200 + 55 * unit(r1.v[2]);
    const double x0 = cx - w / 2, x1 = cx + w / 2, y0 = cy - h / 2, ym = cy, y1 = cy + h / 2;
    // The slant shifts each point's x by slant * (cy - y): the top leans right for slant > 0.
    auto sx = [&](double x, double y) { return x + slant * (cy - y); };
    struct Seg {
      double ax, ay, bx, by;
    };
    const std::array<std::pair<char, Seg>, 7> segs = {{{'a', {x0, y0, x1, y0}}, {'b', {x1, y0, x1, ym}},
                                                       {'c', {x1, ym, x1, y1}}, {'d', {x0, y1, x1, y1}},
                                                       {'e', {x0, ym, x0, y1}}, {'f', {x0, y0, x0, ym}},
                                                       {'g', {x0, ym, x1, ym}}}};
    uint8_t* img = ds.images.data() + i * 28 * 28;
    for (int y = 0; y < 28; ++y)
      for (int x = 0; x < 28; ++x) {
        double v = 0;
        for (const auto& [name, s] : segs) {
          if (!std::strchr(lit[static_cast<std::size_t>(k)], name)) continue;
          const double d = segment_distance(x, y, sx(s.ax, s.ay), s.ay, sx(s.bx, s.by), s.by);
          v = std::max(v, std::clamp(thick / 2 + 0.5 - d, 0.0, 1.0));  // a one-pixel anti-aliased edge
        }
        img[y * 28 + x] = to_byte(v * ink);
      }
  }
  ds.validate();
  return ds;
}

Dataset make_digit_segmentation(const Dataset& digits, int ink_threshold) {
  require_digits(digits, "make_digit_segmentation", false);
  if (ink_threshold < 1 || ink_threshold > 255)
    throw Error(fmt::format("make_digit_segmentation: ink threshold {} is outside 1..255", ink_threshold));
  Dataset ds = digits;
  ds.name = digits.name + "-seg";
  ds.task = Task::Segmentation;
  ds.num_classes = 11;
  ds.class_names = with_digits("background");
  ds.target_length = digits.height * digits.width;
  ds.targets.resize(static_cast<std::size_t>(digits.n) * ds.target_length);
  for (int64_t i = 0; i < digits.n; ++i) {
    ds.labels[i] = digits.labels[i] + 1;
    const uint8_t* img = digits.image(i);
    int32_t* mask = ds.targets.data() + i * ds.target_length;
    for (int p = 0; p < ds.target_length; ++p) mask[p] = img[p] >= ink_threshold ? ds.labels[i] : 0;
  }
  ds.validate();
  return ds;
}

Dataset make_rotated_translated(const Dataset& digits, int canvas, double max_degrees, uint64_t seed) {
  require_digits(digits, "make_rotated_translated", false);
  if (canvas < std::max(digits.height, digits.width) || canvas > 4096)
    throw Error(fmt::format("make_rotated_translated: a canvas of {} does not hold {}x{} digits", canvas,
                            digits.height, digits.width));
  if (!(max_degrees >= 0 && max_degrees <= 180))
    throw Error(fmt::format("make_rotated_translated: max_degrees {} is outside [0, 180]", max_degrees));
  Dataset ds;
  ds.name = digits.name + "-rt";
  ds.n = digits.n;
  ds.channels = 1;
  ds.height = ds.width = canvas;
  ds.num_classes = digits.num_classes;
  ds.class_names = digits.class_names;
  ds.labels = digits.labels;
  ds.images.assign(static_cast<std::size_t>(ds.n) * canvas * canvas, 0);
  const int sh = digits.height, sw = digits.width;
  const double scx = 0.5 * (sw - 1), scy = 0.5 * (sh - 1);
  const uint64_t key = mix_key(seed, kRotateStream);
  for (int64_t i = 0; i < ds.n; ++i) {
    const Philox4x32 r = philox4x32(uint64_t(i), 0, key);
    const double angle = (2 * unit(r.v[0]) - 1) * max_degrees * kPi / 180;
    // The unrotated box's top-left corner lands uniformly in [0, canvas - side].
    const double cx = unit(r.v[1]) * (canvas - sw) + scx, cy = unit(r.v[2]) * (canvas - sh) + scy;
    const double c = std::cos(angle), s = std::sin(angle);
    const uint8_t* src = digits.image(i);
    auto at = [&](int64_t x, int64_t y) { return (x < 0 || y < 0 || x >= sw || y >= sh) ? 0.0 : double(src[y * sw + x]); };
    uint8_t* dst = ds.images.data() + i * canvas * canvas;
    for (int y = 0; y < canvas; ++y)
      for (int x = 0; x < canvas; ++x) {
        // The source point the destination pixel shows: the inverse rotation about the centres.
        const double dx = x - cx, dy = y - cy;
        const double u = c * dx + s * dy + scx, v = -s * dx + c * dy + scy;
        const double fu = std::floor(u), fv = std::floor(v);
        const int64_t u0 = static_cast<int64_t>(fu), v0 = static_cast<int64_t>(fv);
        const double au = u - fu, av = v - fv;
        const double val = (1 - av) * ((1 - au) * at(u0, v0) + au * at(u0 + 1, v0)) +
                           av * ((1 - au) * at(u0, v0 + 1) + au * at(u0 + 1, v0 + 1));
        dst[y * canvas + x] = to_byte(val);
      }
  }
  ds.validate();
  return ds;
}

Dataset make_digit_strings(const Dataset& digits, int64_t n, int max_length, uint64_t seed) {
  require_digits(digits, "make_digit_strings", true);
  if (digits.n < 1) throw Error(fmt::format("make_digit_strings: '{}' has no digits to draw from", digits.name));
  if (n < 0 || max_length < 1 || max_length > 9)
    throw Error(fmt::format("make_digit_strings: n = {}, max_length = {}: need n >= 0 and 1 <= max_length <= 9", n,
                            max_length));
  constexpr int kPitch = 24, kFirstColumn = 2;  // columns 2..25 of a 28-wide digit hold its ink
  Dataset ds;
  ds.name = fmt::format("{}-strings{}-seed{}", digits.name, max_length, seed);
  ds.n = n;
  ds.channels = 1;
  ds.height = 28;
  ds.width = kPitch * max_length;
  ds.task = Task::Sequence;
  ds.num_classes = 11;
  ds.class_names = with_digits("blank");
  ds.target_length = max_length;
  ds.images.assign(static_cast<std::size_t>(n) * ds.height * ds.width, 0);
  ds.labels.resize(static_cast<std::size_t>(n));
  ds.targets.assign(static_cast<std::size_t>(n) * max_length, 0);
  const uint64_t key = mix_key(seed, kStringsStream);
  for (int64_t i = 0; i < n; ++i) {
    const Philox4x32 r = philox4x32(uint64_t(i), 0, key);
    const int len = 1 + static_cast<int>(below(r.v[0], max_length));
    const int64_t start = below(r.v[1], ds.width - kPitch * len + 1);
    ds.labels[i] = len;
    uint8_t* dst = ds.images.data() + i * ds.height * ds.width;
    for (int k = 0; k < len; ++k) {
      const Philox4x32 d = philox4x32(uint64_t(i), uint64_t(1 + k), key);
      const int64_t j = static_cast<int64_t>(((uint64_t(d.v[0]) << 32) | d.v[1]) % uint64_t(digits.n));
      const int64_t x0 = start + int64_t(kPitch) * k + below(d.v[2], 5) - 2;
      ds.targets[static_cast<std::size_t>(i * max_length + k)] = digits.labels[j] + 1;
      const uint8_t* src = digits.image(j);
      for (int y = 0; y < 28; ++y)
        for (int c = 0; c < kPitch; ++c) {
          const int64_t x = x0 + c;
          if (x < 0 || x >= ds.width) continue;
          uint8_t& p = dst[y * ds.width + x];
          p = std::max(p, src[y * 28 + kFirstColumn + c]);
        }
    }
  }
  ds.validate();
  return ds;
}

Dataset make_synthetic_attributes(int64_t n, int fields, uint64_t seed) {
  if (n < 0 || fields < 1 || fields > 128)
    throw Error(fmt::format("make_synthetic_attributes: n = {}, fields = {}: need n >= 0 and 1..128 fields", n, fields));
  static const double weights[] = {1.5, -1.2, 1.0, -0.8, 0.6, -0.4, 0.3, -0.2};
  Dataset ds;
  ds.name = fmt::format("synthetic-attrs{}-seed{}", fields, seed);
  ds.n = n;
  ds.channels = ds.height = 1;
  ds.width = fields;
  ds.categories = 2 * fields;
  ds.num_classes = 2;
  ds.class_names = {"label=0", "label=1"};
  ds.images.resize(static_cast<std::size_t>(n) * fields);
  ds.labels.resize(static_cast<std::size_t>(n));
  const uint64_t key = mix_key(seed, kAttributesStream);
  for (int64_t i = 0; i < n; ++i) {
    double score = 0;
    for (int j = 0; j < fields; ++j) {
      const uint32_t bits = philox4x32(uint64_t(i), uint64_t(j / 4), key).v[j % 4];
      const double rate = 0.2 + 0.6 * (0.37 * j - std::floor(0.37 * j));
      const int b = unit(bits) < rate ? 1 : 0;
      ds.images[static_cast<std::size_t>(i * fields + j)] = static_cast<uint8_t>(2 * j + b);
      if (j < 8) score += weights[j] * (2 * b - 1);
    }
    const uint32_t noise = philox4x32(uint64_t(i), uint64_t(1) << 32, key).v[0];
    ds.labels[i] = score + (unit(noise) - 0.5) * 3.0 > 0 ? 1 : 0;
  }
  ds.validate();
  return ds;
}

}  // namespace ditto
