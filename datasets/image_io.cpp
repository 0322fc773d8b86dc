#include "datasets/detail/image_io.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <thread>

// jpeglib.h needs FILE and size_t declared first.
#include <jpeglib.h>

#include "engine/error.h"

namespace ditto::detail {

std::vector<uint8_t> read_file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw IoError(fmt::format("cannot open '{}'", path));
  std::streamsize size = in.tellg();
  if (size < 0) throw IoError(fmt::format("cannot determine the size of '{}'", path));
  std::vector<uint8_t> bytes(static_cast<std::size_t>(size));
  in.seekg(0);
  if (size > 0 && !in.read(reinterpret_cast<char*>(bytes.data()), size))
    throw IoError(fmt::format("cannot read '{}'", path));
  return bytes;
}

namespace {

// libjpeg reports errors through error_exit, which must not return: we longjmp back to the
// decode (or encode) call, which turns the message into an exception (never exit(), libjpeg's
// default).
struct JpegErrorManager {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void jpeg_error_exit(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

// Warnings (msg_level -1) include "Premature end of JPEG file" and "Corrupt JPEG data": libjpeg
// would fill the rest of the image with grey and carry on. A silently damaged image is worse
// than an error, so warnings are errors here. Trace messages (level >= 0) are ignored.
void jpeg_emit_message(j_common_ptr cinfo, int msg_level) {
  if (msg_level < 0) jpeg_error_exit(cinfo);
}

}  // namespace

DecodedImage decode_jpeg(const std::string& path, const std::vector<uint8_t>& bytes) {
  return decode_jpeg(path, bytes, nullptr);
}

DecodedImage decode_jpeg(const std::string& path, const std::vector<uint8_t>& bytes,
                         const std::function<int(int height, int width)>& scale_denom) {
  // Everything the longjmp may skip over lives outside the setjmp scope and has a trivial
  // destructor or is destroyed explicitly.
  jpeg_decompress_struct cinfo;
  JpegErrorManager err;
  cinfo.err = jpeg_std_error(&err.pub);
  err.pub.error_exit = jpeg_error_exit;
  err.pub.emit_message = jpeg_emit_message;
  err.message[0] = '\0';
  DecodedImage img;
  std::vector<uint8_t> row;
  if (setjmp(err.jump)) {
    std::size_t consumed = cinfo.src ? bytes.size() - cinfo.src->bytes_in_buffer : 0;
    jpeg_destroy_decompress(&cinfo);
    throw DataError(fmt::format("corrupt JPEG '{}' at byte offset {} of {}: {}", path, consumed, bytes.size(),
                                err.message));
  }
  jpeg_create_decompress(&cinfo);
  if (bytes.empty()) {
    jpeg_destroy_decompress(&cinfo);
    throw DataError(fmt::format("corrupt JPEG '{}' at byte offset 0 of 0: empty file", path));
  }
  jpeg_mem_src(&cinfo, bytes.data(), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&cinfo, TRUE);
  // The header's size decides the allocation: a corrupt or hostile header may claim 65535 x
  // 65535 (fuzz_jpeg asked for 5 GB). 8192 x 8192 is far beyond any training image.
  constexpr uint64_t kMaxPixels = uint64_t(1) << 26;
  if (uint64_t(cinfo.image_width) * cinfo.image_height > kMaxPixels) {
    const std::string msg = fmt::format("JPEG '{}' claims {} x {} pixels, more than the {} ditto decodes", path,
                                        cinfo.image_width, cinfo.image_height, kMaxPixels);
    jpeg_destroy_decompress(&cinfo);
    throw DataError(msg);
  }
  if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
    jpeg_destroy_decompress(&cinfo);
    throw DataError(fmt::format("JPEG '{}' is CMYK/YCCK; only RGB and grayscale JPEGs are supported", path));
  }
  bool gray = cinfo.jpeg_color_space == JCS_GRAYSCALE;
  cinfo.out_color_space = gray ? JCS_GRAYSCALE : JCS_RGB;
  if (scale_denom) {
    const int denom = scale_denom(static_cast<int>(cinfo.image_height), static_cast<int>(cinfo.image_width));
    if (denom != 1 && denom != 2 && denom != 4 && denom != 8) {
      jpeg_destroy_decompress(&cinfo);
      throw Error(fmt::format("decode_jpeg '{}': scale 1/{} is not one of 1, 1/2, 1/4, 1/8", path, denom));
    }
    cinfo.scale_num = 1;
    cinfo.scale_denom = static_cast<unsigned int>(denom);
  }
  jpeg_start_decompress(&cinfo);
  const int w = static_cast<int>(cinfo.output_width), h = static_cast<int>(cinfo.output_height);
  const int comps = cinfo.output_components;
  img.channels = 3;
  img.height = h;
  img.width = w;
  img.pixels.assign(static_cast<std::size_t>(3) * h * w, 0);
  row.resize(static_cast<std::size_t>(w) * comps);
  const std::size_t plane = static_cast<std::size_t>(h) * w;
  while (cinfo.output_scanline < cinfo.output_height) {
    const int y = static_cast<int>(cinfo.output_scanline);
    JSAMPROW rows[1] = {row.data()};
    jpeg_read_scanlines(&cinfo, rows, 1);
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c)
        img.pixels[c * plane + static_cast<std::size_t>(y) * w + x] = row[static_cast<std::size_t>(x) * comps + (gray ? 0 : c)];
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return img;
}

DecodedImage decode_jpeg_file(const std::string& path) { return decode_jpeg(path, read_file_bytes(path)); }

Tap bilinear_tap(double pos, int size) {
  pos = std::clamp(pos, 0.0, double(size - 1));
  Tap t;
  t.i0 = static_cast<int>(std::floor(pos));
  t.i1 = std::min(t.i0 + 1, size - 1);
  t.t = pos - t.i0;
  return t;
}

void sample_bilinear(const uint8_t* src, int c, int h, int w, const std::vector<Tap>& ys, const std::vector<Tap>& xs,
                     uint8_t* out) {
  const int out_h = static_cast<int>(ys.size()), out_w = static_cast<int>(xs.size());
  for (int ch = 0; ch < c; ++ch) {
    const uint8_t* p = src + static_cast<std::size_t>(ch) * h * w;
    uint8_t* o = out + static_cast<std::size_t>(ch) * out_h * out_w;
    for (int y = 0; y < out_h; ++y) {
      const Tap& ty = ys[y];
      const uint8_t* r0 = p + static_cast<std::size_t>(ty.i0) * w;
      const uint8_t* r1 = p + static_cast<std::size_t>(ty.i1) * w;
      for (int x = 0; x < out_w; ++x) {
        const Tap& tx = xs[x];
        double top = r0[tx.i0] * (1 - tx.t) + r0[tx.i1] * tx.t;
        double bot = r1[tx.i0] * (1 - tx.t) + r1[tx.i1] * tx.t;
        double v = top * (1 - ty.t) + bot * ty.t;
        o[static_cast<std::size_t>(y) * out_w + x] = static_cast<uint8_t>(std::clamp(std::lround(v), 0L, 255L));
      }
    }
  }
}

std::vector<uint8_t> resize_bilinear(const uint8_t* src, int c, int h, int w, int out_h, int out_w) {
  std::vector<uint8_t> out(static_cast<std::size_t>(c) * out_h * out_w);
  const double sy = double(h) / out_h, sx = double(w) / out_w;
  std::vector<Tap> ys(static_cast<std::size_t>(out_h)), xs(static_cast<std::size_t>(out_w));
  for (int y = 0; y < out_h; ++y) ys[y] = bilinear_tap((y + 0.5) * sy - 0.5, h);
  for (int x = 0; x < out_w; ++x) xs[x] = bilinear_tap((x + 0.5) * sx - 0.5, w);
  sample_bilinear(src, c, h, w, ys, xs, out.data());
  return out;
}

DecodedImage apply_geometry(DecodedImage img, const ImageGeometry& g, const std::string& path) {
  if (g.resize < 0 || g.crop < 0)
    throw Error(fmt::format("image geometry: resize {} and crop {} must be >= 0", g.resize, g.crop));
  if (g.resize > 0) {
    int shorter = std::min(img.height, img.width);
    if (shorter != g.resize) {
      // Round the longer side to nearest, as torchvision's Resize(int) does.
      int oh, ow;
      if (img.height <= img.width) {
        oh = g.resize;
        ow = static_cast<int>(std::lround(double(img.width) * g.resize / img.height));
      } else {
        ow = g.resize;
        oh = static_cast<int>(std::lround(double(img.height) * g.resize / img.width));
      }
      img.pixels = resize_bilinear(img.pixels.data(), img.channels, img.height, img.width, oh, ow);
      img.height = oh;
      img.width = ow;
    }
  }
  if (g.crop > 0) {
    if (img.height < g.crop || img.width < g.crop)
      throw DataError(fmt::format("image '{}' is {}x{}, smaller than the {}x{} centre crop", path, img.height,
                                  img.width, g.crop, g.crop));
    const int oy = (img.height - g.crop) / 2, ox = (img.width - g.crop) / 2;
    std::vector<uint8_t> out(static_cast<std::size_t>(img.channels) * g.crop * g.crop);
    for (int c = 0; c < img.channels; ++c)
      for (int y = 0; y < g.crop; ++y)
        std::copy_n(img.pixels.data() + (static_cast<std::size_t>(c) * img.height + oy + y) * img.width + ox, g.crop,
                    out.data() + (static_cast<std::size_t>(c) * g.crop + y) * g.crop);
    img.pixels = std::move(out);
    img.height = img.width = g.crop;
  }
  return img;
}

void parallel_for(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  const int64_t threads = std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, std::min<int64_t>(n, 64));
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(threads));
  std::vector<int64_t> error_index(static_cast<std::size_t>(threads), n);
  std::atomic<int64_t> next{0};
  auto work = [&](int64_t t) {
    for (;;) {
      int64_t i = next.fetch_add(1);
      if (i >= n) return;
      try {
        fn(i);
      } catch (...) {
        if (i < error_index[t]) {
          error_index[t] = i;
          errors[t] = std::current_exception();
        }
      }
    }
  };
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < threads; ++t) pool.emplace_back(work, t);
  work(0);
  for (auto& th : pool) th.join();
  int64_t best = n;
  std::exception_ptr first;
  for (int64_t t = 0; t < threads; ++t)
    if (errors[t] && error_index[t] < best) {
      best = error_index[t];
      first = errors[t];
    }
  if (first) std::rethrow_exception(first);
}

void decode_into(Dataset& ds, const std::vector<std::string>& paths, const ImageGeometry& g) {
  const int64_t n = static_cast<int64_t>(paths.size());
  std::vector<DecodedImage> decoded(paths.size());
  parallel_for(n, [&](int64_t i) { decoded[i] = apply_geometry(decode_jpeg_file(paths[i]), g, paths[i]); });
  ds.n = n;
  if (n == 0) return;
  ds.channels = decoded[0].channels;
  ds.height = decoded[0].height;
  ds.width = decoded[0].width;
  for (int64_t i = 1; i < n; ++i)
    if (decoded[i].height != ds.height || decoded[i].width != ds.width)
      throw DataError(fmt::format(
          "image '{}' is {}x{} but '{}' is {}x{}: all images must end at one size; ditto-train reads folders of "
          "mixed sizes as --dataset stream-folder (each image resized and centre-cropped to --image-size as it is "
          "loaded), a library caller can pass an ImageGeometry (resize and crop)",
          paths[i],
          decoded[i].height, decoded[i].width, paths[0], ds.height, ds.width));
  const std::size_t per = static_cast<std::size_t>(ds.image_numel());
  ds.images.resize(per * n);
  for (int64_t i = 0; i < n; ++i) {
    std::copy(decoded[i].pixels.begin(), decoded[i].pixels.end(), ds.images.begin() + per * i);
    std::vector<uint8_t>().swap(decoded[i].pixels);
  }
}

}  // namespace ditto::detail

namespace ditto {

std::vector<uint8_t> encode_jpeg(const uint8_t* chw, int channels, int height, int width, int quality) {
  if (channels != 1 && channels != 3)
    throw Error(fmt::format("encode_jpeg: {} channels; JPEG images here are grayscale (1) or RGB (3)", channels));
  if (height < 1 || width < 1 || height > 65500 || width > 65500)
    throw Error(fmt::format("encode_jpeg: {} x {} pixels is not a JPEG size (1 to 65500 a side)", height, width));
  if (quality < 1 || quality > 100) throw Error(fmt::format("encode_jpeg: quality {} is outside 1..100", quality));
  // As in decode_jpeg: what the longjmp may skip over has a trivial destructor or is released
  // explicitly (the output buffer libjpeg allocates with malloc).
  jpeg_compress_struct cinfo;
  detail::JpegErrorManager err;
  cinfo.err = jpeg_std_error(&err.pub);
  err.pub.error_exit = detail::jpeg_error_exit;
  err.pub.emit_message = detail::jpeg_emit_message;
  err.message[0] = '\0';
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  std::vector<uint8_t> row(static_cast<std::size_t>(width) * channels);
  if (setjmp(err.jump)) {
    jpeg_destroy_compress(&cinfo);
    std::free(buffer);
    throw Error(fmt::format("encode_jpeg: libjpeg failed: {}", err.message));
  }
  jpeg_create_compress(&cinfo);
  jpeg_mem_dest(&cinfo, &buffer, &size);
  cinfo.image_width = static_cast<JDIMENSION>(width);
  cinfo.image_height = static_cast<JDIMENSION>(height);
  cinfo.input_components = channels;
  cinfo.in_color_space = channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, quality, TRUE);
  // No chroma subsampling: at 32 x 32 pixels, halving the colour resolution is visible.
  for (int k = 0; k < cinfo.num_components; ++k) cinfo.comp_info[k].h_samp_factor = cinfo.comp_info[k].v_samp_factor = 1;
  jpeg_start_compress(&cinfo, TRUE);
  const std::size_t plane = static_cast<std::size_t>(height) * width;
  while (cinfo.next_scanline < cinfo.image_height) {
    const std::size_t y = cinfo.next_scanline;
    for (int x = 0; x < width; ++x)
      for (int c = 0; c < channels; ++c) row[static_cast<std::size_t>(x) * channels + c] = chw[c * plane + y * width + x];
    JSAMPROW rows[1] = {row.data()};
    jpeg_write_scanlines(&cinfo, rows, 1);
  }
  jpeg_finish_compress(&cinfo);
  std::vector<uint8_t> bytes(buffer, buffer + size);
  jpeg_destroy_compress(&cinfo);
  std::free(buffer);
  return bytes;
}

}  // namespace ditto
