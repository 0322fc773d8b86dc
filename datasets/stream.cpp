// Streamed image folders (see stream.h): listing, the crop draws, and the per-example transform
// the Loader's workers run.
#include "datasets/stream.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <mutex>

#include "datasets/augment.h"
#include "datasets/detail/image_io.h"
#include "datasets/loader.h"
#include "engine/error.h"
#include "engine/philox.h"
#include "engine/tensor.h"

namespace ditto {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kCropStream = 0x7272632d63726f70ull;  // "rrc-crop", a Philox stream of its own

// A uniform double in [0, 1) from a 32-bit word.
double unit(uint32_t w) { return double(w) * (1.0 / 4294967296.0); }
// An integer in [0, range) (range >= 1) from a 32-bit word, as the Loader draws crop offsets.
int below(uint32_t w, int range) { return static_cast<int>((uint64_t(w) * uint64_t(range)) >> 32); }

void check_transform(const StreamTransform& t) {
  auto bad = [](const std::string& what) { throw Error("stream transform: " + what); };
  if (t.size < 1 || t.size > 8192) bad(fmt::format("size {} must be from 1 to 8192", t.size));
  if (t.resize < t.size || t.resize > 65535) bad(fmt::format("resize {} must be from size ({}) to 65535", t.resize, t.size));
  if (!(t.scale_min > 0 && t.scale_min <= t.scale_max && t.scale_max <= 1))
    bad(fmt::format("scale [{}, {}] must satisfy 0 < min <= max <= 1", t.scale_min, t.scale_max));
  if (!(t.ratio_min > 0 && t.ratio_min <= t.ratio_max && std::isfinite(t.ratio_max)))
    bad(fmt::format("ratio [{}, {}] must satisfy 0 < min <= max", t.ratio_min, t.ratio_max));
  if (t.mean.size() != 3 || t.std.size() != 3) bad("mean and std need three values (R, G, B)");
  for (float s : t.std)
    if (!(s > 0)) bad(fmt::format("std {} must be > 0", s));
}

// The source region an output covers, as per-axis taps for an image of h x w, and the
// evaluation transform's or a crop box's geometry.
struct Region {
  std::vector<detail::Tap> ys, xs;
};

// Evaluation: resize the shorter side to t.resize (the longer rounded to nearest, as
// apply_geometry does), centre crop t.size; sampled directly at the resized grid's positions.
void eval_positions(int h, int w, const StreamTransform& t, std::vector<double>& ys, std::vector<double>& xs) {
  int oh = h, ow = w;
  if (std::min(h, w) != t.resize) {
    if (h <= w) {
      oh = t.resize;
      ow = static_cast<int>(std::lround(double(w) * t.resize / h));
    } else {
      ow = t.resize;
      oh = static_cast<int>(std::lround(double(h) * t.resize / w));
    }
  }
  const int oy = (oh - t.size) / 2, ox = (ow - t.size) / 2;
  const double sy = double(h) / oh, sx = double(w) / ow;
  ys.resize(t.size);
  xs.resize(t.size);
  for (int y = 0; y < t.size; ++y) ys[y] = (oy + y + 0.5) * sy - 0.5;
  for (int x = 0; x < t.size; ++x) xs[x] = (ox + x + 0.5) * sx - 0.5;
}

// Training: the box [y0, y0 + bh) x [x0, x0 + bw) resized to t.size (torchvision's resized_crop).
void box_positions(const CropBox& b, const StreamTransform& t, std::vector<double>& ys, std::vector<double>& xs) {
  const double sy = double(b.h) / t.size, sx = double(b.w) / t.size;
  ys.resize(t.size);
  xs.resize(t.size);
  for (int y = 0; y < t.size; ++y) ys[y] = b.y + (y + 0.5) * sy - 0.5;
  for (int x = 0; x < t.size; ++x) xs[x] = b.x + (x + 0.5) * sx - 0.5;
}

class StreamFolder : public ImageSource {
 public:
  StreamFolder(std::string root, std::shared_ptr<const std::vector<std::string>> paths,
               std::shared_ptr<const std::vector<uint64_t>> sizes, int64_t count, StreamTransform t)
      : root_(std::move(root)), paths_(std::move(paths)), sizes_(std::move(sizes)), count_(count), t_(std::move(t)) {}

  int64_t size() const override { return count_; }

  void prepare(int64_t index, int epoch, const LoaderOptions& opts, float* dst) const override {
    const std::vector<uint8_t> pixels = transformed(index, epoch, opts.augment, opts.seed_augment, opts.flip);
    normalize_example(pixels.data(), 3, int64_t(t_.size) * t_.size, opts, dst);
  }

  std::vector<uint8_t> eval_image(int64_t index) const override { return transformed(index, 0, false, 0, false); }

  Fingerprint fingerprint() const override {
    std::call_once(fingerprinted_->once, [this] { fingerprinted_->value = contents_fingerprint(); });
    return fingerprinted_->value;
  }

  ChannelStats stats() const override { return {t_.mean, t_.std}; }

  // Each file's relative path and bytes (detail::read_file_bytes names the file when it cannot be read,
  // or when it is no longer the size it was listed with), then the transform.
  Fingerprint contents_fingerprint() const {
    Hasher h;
    h.add(std::string("ditto-stream-folder"));
    for (int64_t i = 0; i < count_; ++i) {
      const std::string& path = (*paths_)[i];
      h.add(fs::path(path).lexically_relative(root_).generic_string());
      const std::vector<uint8_t> bytes = detail::read_file_bytes(path);
      if (bytes.size() != (*sizes_)[i])
        throw DataError(fmt::format("{}: {} bytes now, {} when the folder was listed: the data changed during the run",
                                    path, bytes.size(), (*sizes_)[i]));
      h.sized(bytes.data(), bytes.size());
    }
    return h.add(describe()).digest();
  }

  std::shared_ptr<const ImageSource> first(int64_t n) const override {
    if (n < 0 || n > count_) throw Error(fmt::format("stream folder: first {} of {} images", n, count_));
    return std::make_shared<StreamFolder>(root_, paths_, sizes_, n, t_);
  }

  std::string describe() const override {
    return fmt::format("streamed JPEG folder: training RandomResizedCrop({}, scale=({}, {}), ratio=({:.6g}, {:.6g})) + "
                       "flip, evaluation resize {} + centre crop {}, bilinear without antialiasing, DCT scaling {}",
                       t_.size, t_.scale_min, t_.scale_max, t_.ratio_min, t_.ratio_max, t_.resize, t_.size,
                       t_.dct_scaling ? "on" : "off");
  }

 private:
  // The file decoded (at the DCT scale the crop allows) and cropped to size x size, 8-bit CHW.
  std::vector<uint8_t> transformed(int64_t index, int epoch, bool train, uint64_t seed, bool flip) const {
    if (index < 0 || index >= count_)
      throw Error(fmt::format("stream folder: image {} of {}", index, count_));
    const std::string& path = (*paths_)[index];
    const std::vector<uint8_t> bytes = detail::read_file_bytes(path);
    CropBox box;
    std::vector<double> ys, xs;
    int header_h = 0, header_w = 0;
    // The positions are fixed by the header's size; the scale is chosen from them before decoding.
    auto choose = [&](int h, int w) {
      header_h = h;
      header_w = w;
      if (train) {
        box = random_resized_crop(seed, epoch, index, h, w, t_, flip);
        box_positions(box, t_, ys, xs);
      } else {
        eval_positions(h, w, t_, ys, xs);
      }
      if (!t_.dct_scaling) return 1;
      // The source extent the output covers; decode at 1/d while that is still >= size pixels.
      const double extent_y = ys.size() > 1 ? (ys.back() - ys.front()) * t_.size / (t_.size - 1) : h;
      const double extent_x = xs.size() > 1 ? (xs.back() - xs.front()) * t_.size / (t_.size - 1) : w;
      int d = 8;
      while (d > 1 && (extent_y / d < t_.size || extent_x / d < t_.size)) d /= 2;
      return d;
    };
    const detail::DecodedImage img = detail::decode_jpeg(path, bytes, choose);
    // Positions in the decoded image: the same points of the picture, at its scale.
    const double fy = double(img.height) / header_h, fx = double(img.width) / header_w;
    std::vector<detail::Tap> ty(ys.size()), tx(xs.size());
    for (std::size_t y = 0; y < ys.size(); ++y)
      ty[y] = detail::bilinear_tap(fy == 1.0 ? ys[y] : (ys[y] + 0.5) * fy - 0.5, img.height);
    for (std::size_t x = 0; x < xs.size(); ++x) {
      const std::size_t from = box.flip ? xs.size() - 1 - x : x;
      tx[x] = detail::bilinear_tap(fx == 1.0 ? xs[from] : (xs[from] + 0.5) * fx - 0.5, img.width);
    }
    std::vector<uint8_t> out(static_cast<std::size_t>(3) * t_.size * t_.size);
    detail::sample_bilinear(img.pixels.data(), 3, img.height, img.width, ty, tx, out.data());
    return out;
  }

  std::string root_;
  std::shared_ptr<const std::vector<std::string>> paths_;
  std::shared_ptr<const std::vector<uint64_t>> sizes_;
  int64_t count_;
  StreamTransform t_;
  // The contents' fingerprint, computed on the first call.
  struct Fingerprinted {
    std::once_flag once;
    Fingerprint value;
  };
  std::unique_ptr<Fingerprinted> fingerprinted_ = std::make_unique<Fingerprinted>();
};

}  // namespace

CropBox random_resized_crop(uint64_t seed_augment, int epoch, int64_t index, int height, int width,
                            const StreamTransform& t, bool flip) {
  const uint64_t key = mix_key(seed_augment, kCropStream);
  // Draw k uses counter (index, epoch | k << 32): four words, area, ratio, row, column.
  auto draw = [&](uint32_t k) { return philox4x32(uint64_t(index), uint64_t(uint32_t(epoch)) | (uint64_t(k) << 32), key); };
  CropBox b;
  const double area = double(height) * width;
  const double log_lo = std::log(t.ratio_min), log_hi = std::log(t.ratio_max);
  for (int k = 0; k < 10 && !b.h; ++k) {
    const Philox4x32 r = draw(uint32_t(k));
    const double target = area * (t.scale_min + unit(r.v[0]) * (t.scale_max - t.scale_min));
    const double ratio = std::exp(log_lo + unit(r.v[1]) * (log_hi - log_lo));
    const int w = static_cast<int>(std::lround(std::sqrt(target * ratio)));
    const int h = static_cast<int>(std::lround(std::sqrt(target / ratio)));
    b.draws = k + 1;
    if (w > 0 && w <= width && h > 0 && h <= height) {
      b.h = h;
      b.w = w;
      b.y = below(r.v[2], height - h + 1);
      b.x = below(r.v[3], width - w + 1);
    }
  }
  if (!b.h) {  // torchvision's fallback: the centre crop of the ratio clamped into range
    b.draws = 11;
    const double in_ratio = double(width) / height;
    if (in_ratio < t.ratio_min) {
      b.w = width;
      b.h = std::max(1, static_cast<int>(std::lround(b.w / t.ratio_min)));
    } else if (in_ratio > t.ratio_max) {
      b.h = height;
      b.w = std::max(1, static_cast<int>(std::lround(b.h * t.ratio_max)));
    } else {
      b.w = width;
      b.h = height;
    }
    b.h = std::min(b.h, height);
    b.w = std::min(b.w, width);
    b.y = (height - b.h) / 2;
    b.x = (width - b.w) / 2;
  }
  b.flip = flip && (draw(16).v[0] >> 31) != 0;
  return b;
}

Dataset stream_image_folder(const std::string& root, const std::string& split, const StreamTransform& t) {
  check_transform(t);
  Dataset ds;
  auto paths = std::make_shared<std::vector<std::string>>(detail::list_image_folder(root, split, ds));
  auto sizes = std::make_shared<std::vector<uint64_t>>();
  sizes->reserve(paths->size());
  for (const auto& p : *paths) {
    std::error_code ec;
    const uint64_t bytes = fs::file_size(p, ec);
    if (ec) throw IoError(fmt::format("cannot read the size of '{}': {}", p, ec.message()));
    sizes->push_back(bytes);
  }
  ds.channels = 3;
  ds.height = ds.width = t.size;
  ds.source = std::make_shared<StreamFolder>(split.empty() ? root : (fs::path(root) / split).string(), paths, sizes,
                                             ds.n, t);
  ds.validate();
  return ds;
}

}  // namespace ditto
