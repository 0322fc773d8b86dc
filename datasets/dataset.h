// Datasets held in memory, decoded once: images as uint8 NCHW, labels int32, optional
// per-example subgroup ids (for per-subgroup metrics). Every loader checks its input and
// throws DataError naming the file and the byte offset (binary files) or line (text files)
// for truncated or corrupt input and for labels out of range, and IoError for a file that
// cannot be opened. Nothing here depends on threads or timing: the same files give the same
// bytes.
//
// This header is installed: it pulls in no libjpeg, zlib, fmt or json headers.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ditto {

class ImageSource;  // datasets/stream.h

struct ChannelStats {
  // Per channel, over every pixel of every image, on the [0, 1] scale (pixel / 255): the
  // scale LoaderOptions::mean / std are given in. std is the population standard deviation.
  std::vector<float> mean, std;
};

struct Dataset {
  std::string name;                    // e.g. "cifar10/train"
  int64_t n = 0;                       // number of examples
  int channels = 0, height = 0, width = 0;
  std::vector<uint8_t> images;         // n * channels * height * width, NCHW
  std::vector<int32_t> labels;         // n, each in [0, num_classes)
  int num_classes = 0;
  std::vector<std::string> class_names;     // num_classes entries
  std::vector<int32_t> subgroups;           // empty, or n ids in [0, subgroup_names.size())
  std::vector<std::string> subgroup_names;  // e.g. "Male=0", "Male=1"
  // A streamed data set (datasets/stream.h) has no `images`: each example is decoded when a
  // Loader asks for it, at channels x height x width. The statistics, fingerprint and take_first
  // below ask the source.
  std::shared_ptr<const ImageSource> source;

  int64_t size() const { return n; }
  int64_t image_numel() const { return int64_t(channels) * height * width; }
  // Example i's pixels; Error for a streamed data set (use source->eval_image).
  const uint8_t* image(int64_t i) const;
  bool has_subgroups() const { return !subgroups.empty(); }
  bool streamed() const { return source != nullptr; }

  // Per-channel mean / std on the [0, 1] scale, accumulated in double in index order (a streamed
  // data set's source says them: datasets/stream.h).
  ChannelStats channel_stats() const;
  // Examples per class (num_classes entries) and per subgroup (empty without subgroups).
  std::vector<int64_t> class_counts() const;
  std::vector<int64_t> subgroup_counts() const;
  // One line: name, count, shape, classes with counts, subgroups with counts, fingerprint.
  std::string summary() const;
  // 64-bit hash of images, labels and subgroups (same scheme as Tensor::fingerprint).
  uint64_t fingerprint() const;
  // Throws DataError when the sizes disagree or a label / subgroup id is out of range.
  void validate() const;
};

enum class Split { Train, Val, Test };
const char* split_name(Split s);

// CIFAR-10 binary release: dir/data_batch_1.bin .. data_batch_5.bin (Train) or
// dir/test_batch.bin (Test). Record = 1 label byte + 3072 bytes (R, G, B planes of 32x32).
Dataset load_cifar10(const std::string& dir, Split split);

// CIFAR-100 binary release: dir/train.bin or dir/test.bin. Record = coarse label byte + fine
// label byte + 3072 bytes. Class names come from fine_label_names.txt / coarse_label_names.txt
// in dir when present, else "fine_<k>" / "coarse_<k>".
enum class Cifar100Labels { Fine, Coarse };
Dataset load_cifar100(const std::string& dir, Split split, Cifar100Labels which = Cifar100Labels::Fine);

// Optional geometry for decoded JPEGs: resize so the shorter side is `resize` pixels (bilinear,
// half-pixel centres, no antialiasing), then centre-crop `crop` x `crop` (offset floor((h-crop)/2)).
// 0 leaves that step out. After it every image must have the same size (DataError otherwise).
struct ImageGeometry {
  int resize = 0;
  int crop = 0;
};

// Image folder: root/<split>/<class>/*.jpg|*.jpeg (case-insensitive). Classes are the
// subdirectories sorted by name; files are sorted by name within a class. Grayscale JPEGs are
// expanded to 3 channels. Other image formats (png, bmp, gif, webp) are rejected with DataError
// rather than skipped; files with other extensions are ignored. Decoding uses every core;
// the result does not depend on it. An empty split names root itself.
Dataset load_image_folder(const std::string& root, const std::string& split, ImageGeometry geometry = {});

// CelebA: root/img_align_celeba/*.jpg, root/list_attr_celeba.txt (count line, attribute-name
// line, then "file ±1 ..."), root/list_eval_partition.txt ("file 0|1|2" = train/val/test).
// label = 1 where label_attribute is +1. The subgroup attributes form one subgroup id
// sum_k bit_k << k (bit_k = attribute k is +1), named like "Male=1" or "Male=1,Young=0".
// Examples keep the order of the attribute file.
struct CelebAOptions {
  std::string label_attribute = "Blond_Hair";
  std::vector<std::string> subgroup_attributes = {"Male"};
  ImageGeometry geometry{};
};
Dataset load_celeba(const std::string& root, Split split, const CelebAOptions& options = {});

// MNIST IDX: dir/train-images-idx3-ubyte + train-labels-idx1-ubyte (Train) or t10k-* (Test),
// each read as given or, when absent, with a .gz suffix (read through zlib). Magic numbers
// (2051 images, 2049 labels), counts and sizes are checked; labels must be < 10. Offsets in
// errors for .gz files count bytes of the decompressed stream.
Dataset load_mnist(const std::string& dir, Split split);

// Procedural, class-dependent images of any size. Class k is an oriented sinusoid grating
// (orientation pi*k/K, two spatial frequencies alternating with k) with per-example random
// orientation jitter (+-1.5 class spacings, so classes overlap), frequency jitter, colour,
// phase, contrast, a random distractor blob and pixel noise, all drawn from Philox keyed by
// (seed, example index). No classifier reaches 100%: there are examples near the decision
// boundary, where run-to-run noise shows as churn. The class
// parameters do not depend on the seed, so a train set and a test set made with different
// seeds share one distribution. Labels are index % num_classes. Deterministic for a seed
// (the pattern is computed in double and rounded to uint8).
Dataset make_synthetic(int64_t n, int num_classes, int channels, int height, int width, uint64_t seed);

// A CHW uint8 image (1 channel: grayscale, 3: RGB) as a baseline JPEG in memory, libjpeg-turbo's
// compressor at `quality` (1..100) without chroma subsampling: for looking at examples (the
// experiment report's thumbnails), not for training data. Throws Error for other channel
// counts, sizes or qualities.
std::vector<uint8_t> encode_jpeg(const uint8_t* chw, int channels, int height, int width, int quality = 90);

// The first n examples (0 <= n <= ds.n, Error otherwise), class names and subgroups kept.
Dataset take_first(const Dataset& ds, int64_t n);

}  // namespace ditto
