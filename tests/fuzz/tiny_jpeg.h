// A valid 8x8 RGB JPEG encoded with libjpeg at run time, for targets that need a real image
// beside the file they fuzz (the corpus stays free of binaries made elsewhere).
#pragma once
#include <cstddef>
#include <cstdio>  // jpeglib.h needs size_t and FILE first
#include <cstdlib>
#include <vector>

#include <jpeglib.h>

namespace fuzz {

inline std::vector<unsigned char> tiny_jpeg() {
  jpeg_compress_struct c;
  jpeg_error_mgr err;
  c.err = jpeg_std_error(&err);
  jpeg_create_compress(&c);
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&c, &buf, &size);
  c.image_width = 8;
  c.image_height = 8;
  c.input_components = 3;
  c.in_color_space = JCS_RGB;
  jpeg_set_defaults(&c);
  jpeg_start_compress(&c, TRUE);
  unsigned char row[8 * 3];
  for (int y = 0; y < 8; ++y) {
    for (int x = 0; x < 8 * 3; ++x) row[x] = static_cast<unsigned char>(x * 10 + y * 20);
    JSAMPROW r = row;
    jpeg_write_scanlines(&c, &r, 1);
  }
  jpeg_finish_compress(&c);
  jpeg_destroy_compress(&c);
  std::vector<unsigned char> out(buf, buf + size);
  std::free(buf);
  return out;
}

}  // namespace fuzz
