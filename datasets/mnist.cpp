// MNIST IDX files, raw or gzipped (zlib's gzread reads both: a file without the gzip header is
// passed through unchanged).
#include <fmt/format.h>
#include <zlib.h>

#include <algorithm>
#include <filesystem>

#include "datasets/dataset.h"
#include "engine/error.h"

namespace ditto {
namespace fs = std::filesystem;

namespace {

class IdxReader {
 public:
  explicit IdxReader(std::string path) : path_(std::move(path)) {
    file_ = gzopen(path_.c_str(), "rb");
    if (!file_) throw IoError(fmt::format("cannot open '{}'", path_));
    gzbuffer(file_, 1 << 18);
    where_ = path_.size() > 3 && path_.compare(path_.size() - 3, 3, ".gz") == 0 ? " of the decompressed stream" : "";
  }
  ~IdxReader() { if (file_) gzclose(file_); }
  IdxReader(const IdxReader&) = delete;
  IdxReader& operator=(const IdxReader&) = delete;

  // Reads exactly n bytes; DataError naming the file and the offset where data ran out.
  void read(void* dst, std::size_t n, const char* what) {
    auto* p = static_cast<unsigned char*>(dst);
    std::size_t got = 0;
    while (got < n) {
      const unsigned chunk = static_cast<unsigned>(std::min<std::size_t>(n - got, 1u << 30));
      int r = gzread(file_, p + got, chunk);
      if (r < 0) {
        int code = 0;
        const char* msg = gzerror(file_, &code);
        throw DataError(fmt::format("corrupt MNIST file '{}' at byte offset {}{} while reading {}: {}", path_,
                                    offset_ + got, where_, what, msg ? msg : "read error"));
      }
      if (r == 0)
        throw DataError(fmt::format("truncated MNIST file '{}': {} ends at byte offset {}{}, {} bytes short", path_,
                                    what, offset_ + got, where_, n - got));
      got += static_cast<std::size_t>(r);
    }
    offset_ += n;
  }
  uint32_t read_be32(const char* what) {
    unsigned char b[4];
    read(b, 4, what);
    return (uint32_t(b[0]) << 24) | (uint32_t(b[1]) << 16) | (uint32_t(b[2]) << 8) | b[3];
  }
  // Nothing may follow the data.
  void expect_end() {
    unsigned char extra;
    int r = gzread(file_, &extra, 1);
    if (r > 0)
      throw DataError(fmt::format("MNIST file '{}' has trailing bytes after the data, from byte offset {}{}", path_,
                                  offset_, where_));
    if (r < 0) {
      int code = 0;
      throw DataError(fmt::format("corrupt MNIST file '{}' at byte offset {}{}: {}", path_, offset_, where_,
                                  gzerror(file_, &code)));
    }
  }
  uint64_t offset() const { return offset_; }
  const std::string& path() const { return path_; }
  const char* where() const { return where_; }

 private:
  std::string path_;
  gzFile file_ = nullptr;
  uint64_t offset_ = 0;
  const char* where_ = "";
};

// n bytes of `in`, the buffer grown as they arrive: a header that claims more than the file holds
// (up to 2^32 images of 4096x4096) fails at the truncation, having allocated only what was there.
std::vector<uint8_t> read_grown(IdxReader& in, uint64_t n, const char* what) {
  constexpr uint64_t kChunk = uint64_t(1) << 24;
  std::vector<uint8_t> out;
  for (uint64_t done = 0; done < n;) {
    const uint64_t step = std::min(kChunk, n - done);
    out.resize(static_cast<std::size_t>(done + step));
    in.read(out.data() + done, static_cast<std::size_t>(step), what);
    done += step;
  }
  return out;
}

std::string resolve(const fs::path& dir, const std::string& name) {
  std::error_code ec;
  if (fs::exists(dir / name, ec)) return (dir / name).string();
  if (fs::exists(dir / (name + ".gz"), ec)) return (dir / (name + ".gz")).string();
  throw IoError(fmt::format("cannot open '{}' (nor '{}.gz')", (dir / name).string(), (dir / name).string()));
}

}  // namespace

Dataset load_mnist(const std::string& dir, Split split) {
  if (split == Split::Val) throw Error("MNIST has no validation split (use take_first or a split of train)");
  const std::string prefix = split == Split::Train ? "train" : "t10k";
  IdxReader images(resolve(dir, prefix + "-images-idx3-ubyte"));
  IdxReader labels(resolve(dir, prefix + "-labels-idx1-ubyte"));

  const uint32_t img_magic = images.read_be32("the magic number");
  if (img_magic != 2051)
    throw DataError(fmt::format("MNIST file '{}' at byte offset 0: magic number {} is not 2051 (IDX images)",
                                images.path(), img_magic));
  const uint32_t count = images.read_be32("the image count");
  const uint32_t rows = images.read_be32("the row count");
  const uint32_t cols = images.read_be32("the column count");
  if (rows == 0 || cols == 0 || rows > 4096 || cols > 4096)
    throw DataError(fmt::format("MNIST file '{}' at byte offset 8: implausible image size {}x{}", images.path(), rows, cols));
  const uint32_t lab_magic = labels.read_be32("the magic number");
  if (lab_magic != 2049)
    throw DataError(fmt::format("MNIST file '{}' at byte offset 0: magic number {} is not 2049 (IDX labels)",
                                labels.path(), lab_magic));
  const uint32_t lab_count = labels.read_be32("the label count");
  if (lab_count != count)
    throw DataError(fmt::format("MNIST label file '{}' (byte offset 4) counts {} labels but image file '{}' counts {} images",
                                labels.path(), lab_count, images.path(), count));

  Dataset ds;
  ds.name = fmt::format("mnist/{}", split_name(split));
  ds.n = count;
  ds.channels = 1;
  ds.height = static_cast<int>(rows);
  ds.width = static_cast<int>(cols);
  ds.num_classes = 10;
  for (int k = 0; k < 10; ++k) ds.class_names.push_back(std::to_string(k));
  ds.images = read_grown(images, uint64_t(count) * rows * cols, "the pixel data");
  images.expect_end();
  const uint64_t label_start = labels.offset();
  const std::vector<uint8_t> raw = read_grown(labels, count, "the labels");
  labels.expect_end();
  ds.labels.resize(count);
  for (uint32_t i = 0; i < count; ++i) {
    if (raw[i] >= 10)
      throw DataError(fmt::format("MNIST file '{}': label {} of example {} at byte offset {}{} is outside [0, 10)",
                                  labels.path(), raw[i], i, label_start + i, labels.where()));
    ds.labels[i] = raw[i];
  }
  ds.validate();
  return ds;
}

}  // namespace ditto
