// Image folders: root/<split>/<class>/*.jpg, decoded with libjpeg (see detail/image_io.h).
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <filesystem>

#include "datasets/dataset.h"
#include "datasets/detail/image_io.h"
#include "engine/error.h"

namespace ditto {
namespace fs = std::filesystem;

namespace {
std::string lower_ext(const fs::path& p) {
  std::string e = p.extension().string();
  std::transform(e.begin(), e.end(), e.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return e;
}
}  // namespace

namespace detail {

std::vector<std::string> list_image_folder(const std::string& root, const std::string& split, Dataset& ds) {
  const fs::path base = split.empty() ? fs::path(root) : fs::path(root) / split;
  std::error_code ec;
  if (!fs::is_directory(base, ec)) throw IoError(fmt::format("image folder '{}' is not a readable directory", base.string()));
  ds.name = fmt::format("{}{}{}", fs::path(root).filename().string(), split.empty() ? "" : "/", split);
  std::vector<fs::path> class_dirs;
  for (const auto& entry : fs::directory_iterator(base))
    if (entry.is_directory() && entry.path().filename().string()[0] != '.') class_dirs.push_back(entry.path());
  // Sorted by name (byte order), so labels do not depend on the file system's listing order.
  std::sort(class_dirs.begin(), class_dirs.end(),
            [](const fs::path& a, const fs::path& b) { return a.filename().string() < b.filename().string(); });
  if (class_dirs.empty()) throw DataError(fmt::format("image folder '{}' has no class subdirectories", base.string()));
  std::vector<std::string> paths;
  for (std::size_t k = 0; k < class_dirs.size(); ++k) {
    std::vector<std::string> files;
    // Images in folders below a class folder belong to that class, as in torchvision's ImageFolder
    // (which walks each class folder); hidden folders (".ipynb_checkpoints") are not read, like
    // hidden class folders.
    for (auto it = fs::recursive_directory_iterator(class_dirs[k]); it != fs::recursive_directory_iterator(); ++it) {
      const auto& entry = *it;
      if (entry.is_directory() && entry.path().filename().string()[0] == '.') {
        it.disable_recursion_pending();
        continue;
      }
      if (!entry.is_regular_file()) continue;
      const std::string ext = lower_ext(entry.path());
      if (ext == ".jpg" || ext == ".jpeg")
        files.push_back(entry.path().string());
      else if (ext == ".png" || ext == ".bmp" || ext == ".gif" || ext == ".webp")
        throw DataError(fmt::format("image '{}': only JPEG is supported (convert the folder to .jpg)",
                                    entry.path().string()));
    }
    if (files.empty())
      throw DataError(fmt::format("class folder '{}' holds no .jpg/.jpeg files", class_dirs[k].string()));
    std::sort(files.begin(), files.end());
    ds.class_names.push_back(class_dirs[k].filename().string());
    for (auto& f : files) {
      paths.push_back(std::move(f));
      ds.labels.push_back(static_cast<int32_t>(k));
    }
  }
  ds.num_classes = static_cast<int>(class_dirs.size());
  ds.n = static_cast<int64_t>(paths.size());
  return paths;
}

}  // namespace detail

Dataset load_image_folder(const std::string& root, const std::string& split, ImageGeometry geometry) {
  Dataset ds;
  const std::vector<std::string> paths = detail::list_image_folder(root, split, ds);
  detail::decode_into(ds, paths, geometry);
  ds.validate();
  return ds;
}

}  // namespace ditto
