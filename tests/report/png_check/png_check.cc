// report_png_check FILE MIN_NONWHITE MIN_SATURATED: reads a PNG with cairo and prints its size,
// the fraction of pixels that are not white and the number of strongly coloured ones (the report's
// figures: axes and text are grey); exits 1 when either is below its minimum (a blank or
// figure-less screenshot), 2 when the file is not a PNG.
#include <cairo.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: report_png_check FILE MIN_NONWHITE MIN_SATURATED\n");
    return 2;
  }
  cairo_surface_t* s = cairo_image_surface_create_from_png(argv[1]);
  if (cairo_surface_status(s) != CAIRO_STATUS_SUCCESS) {
    std::fprintf(stderr, "%s: %s\n", argv[1], cairo_status_to_string(cairo_surface_status(s)));
    return 2;
  }
  const int w = cairo_image_surface_get_width(s), h = cairo_image_surface_get_height(s);
  const int stride = cairo_image_surface_get_stride(s);
  const unsigned char* data = cairo_image_surface_get_data(s);
  size_t nonwhite = 0, saturated = 0;
  for (int y = 0; y < h; ++y) {
    const uint32_t* row = reinterpret_cast<const uint32_t*>(data + size_t(y) * size_t(stride));
    for (int x = 0; x < w; ++x) {
      const uint32_t p = row[x] & 0xffffff;
      const int r = int(p >> 16), g = int((p >> 8) & 0xff), b = int(p & 0xff);
      if (std::min({r, g, b}) < 245) ++nonwhite;
      if (std::max({r, g, b}) - std::min({r, g, b}) > 80) ++saturated;
    }
  }
  cairo_surface_destroy(s);
  const double frac = double(nonwhite) / (double(w) * h);
  std::printf("%s: %dx%d, %.1f%% not white, %zu strongly coloured pixels\n", argv[1], w, h,
              100.0 * frac, saturated);
  return frac >= std::atof(argv[2]) && double(saturated) >= std::atof(argv[3]) ? 0 : 1;
}
