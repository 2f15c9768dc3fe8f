#include "strata/report/plot.h"

#include <cairo.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>

#include "strata/core/check.h"

namespace strata::report {

Rgb palette(size_t i) {
  // Tableau 10, then its lighter companions: distinct on white, in print and for most colour
  // vision.
  static const Rgb colors[] = {
      {0.122, 0.467, 0.706}, {1.000, 0.498, 0.055}, {0.173, 0.627, 0.173}, {0.839, 0.153, 0.157},
      {0.580, 0.404, 0.741}, {0.549, 0.337, 0.294}, {0.890, 0.467, 0.761}, {0.498, 0.498, 0.498},
      {0.737, 0.741, 0.133}, {0.090, 0.745, 0.812}, {0.682, 0.780, 0.910}, {1.000, 0.733, 0.471},
      {0.596, 0.875, 0.541}, {1.000, 0.596, 0.588}, {0.773, 0.690, 0.835}, {0.769, 0.612, 0.580},
      {0.969, 0.714, 0.824}, {0.780, 0.780, 0.780}, {0.859, 0.859, 0.553}, {0.620, 0.855, 0.898}};
  return colors[i % (sizeof colors / sizeof colors[0])];
}

namespace {

// Heckbert's nice numbers: 1, 2, 5 or 10 times a power of ten, rounded or at least x.
double nice_number(double x, bool round) {
  const double e = std::floor(std::log10(x)), f = x / std::pow(10.0, e);
  double n;
  if (round) {
    n = f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10;
  } else {
    n = f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10;
  }
  return n * std::pow(10.0, e);
}

}  // namespace

Ticks nice_ticks(double lo, double hi, int target, bool integer) {
  if (!(hi > lo)) {
    const double pad = lo == 0 ? 1.0 : std::abs(lo) * 0.1;
    lo -= pad, hi += pad;
  }
  Ticks t;
  t.step = nice_number(nice_number(hi - lo, false) / double(std::max(1, target - 1)), true);
  if (integer) t.step = std::max(1.0, std::round(t.step));
  t.lo = std::floor(lo / t.step + 1e-9) * t.step;
  t.hi = std::ceil(hi / t.step - 1e-9) * t.step;
  for (double v = t.lo; v <= t.hi + t.step * 1e-6; v += t.step) {
    t.values.push_back(std::abs(v) < t.step * 1e-9 ? 0.0 : v);
  }
  return t;
}

std::string tick_label(double v, double step, double magnitude) {
  char buf[48];
  if (v == 0) return "0";
  if (magnitude >= 1e4) {
    const char* suffix = magnitude >= 1e9 ? "G" : magnitude >= 1e6 ? "M" : "k";
    const double unit = magnitude >= 1e9 ? 1e9 : magnitude >= 1e6 ? 1e6 : 1e3;
    const int decimals = std::max(0, int(-std::floor(std::log10(step / unit) + 1e-9)));
    std::snprintf(buf, sizeof buf, "%.*f%s", decimals, v / unit, suffix);
    return buf;
  }
  if (magnitude < 1e-3) {
    const int decimals =
        std::max(0, int(std::floor(std::log10(magnitude)) - std::floor(std::log10(step) + 1e-9)));
    std::snprintf(buf, sizeof buf, "%.*e", decimals, v);
    return buf;
  }
  const int decimals = std::max(0, int(-std::floor(std::log10(step) + 1e-9)));
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

namespace {

using Surface = std::unique_ptr<cairo_surface_t, decltype(&cairo_surface_destroy)>;
using Context = std::unique_ptr<cairo_t, decltype(&cairo_destroy)>;

constexpr double kFont = 12.0, kTitleFont = 14.0;

void set_font(cairo_t* cr, double size, bool bold = false) {
  cairo_select_font_face(cr, "DejaVu Sans", CAIRO_FONT_SLANT_NORMAL,
                         bold ? CAIRO_FONT_WEIGHT_BOLD : CAIRO_FONT_WEIGHT_NORMAL);
  cairo_set_font_size(cr, size);
}

double text_width(cairo_t* cr, const std::string& s) {
  cairo_text_extents_t e;
  cairo_text_extents(cr, s.c_str(), &e);
  return e.x_advance;
}

// Text at (x, y) with its baseline at y; align 0 left, 0.5 centre, 1 right.
void text(cairo_t* cr, double x, double y, const std::string& s, double align = 0.0) {
  cairo_move_to(cr, x - align * text_width(cr, s), y);
  cairo_show_text(cr, s.c_str());
}

void set_rgb(cairo_t* cr, Rgb c, double alpha = 1.0) {
  cairo_set_source_rgba(cr, c.r, c.g, c.b, alpha);
}

bool finite(double v) {
  return std::isfinite(v);
}

struct Range {
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  void add(double v) {
    if (finite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
  }
  bool empty() const { return !(lo <= hi); }
};

// The cumulative tops of a panel's stacked series (one vector per stacked series, in order).
std::vector<std::vector<double>> stack_tops(const Panel& p) {
  std::vector<std::vector<double>> tops;
  std::vector<double> base;
  for (const Series& s : p.series) {
    if (!p.stacked || !s.stacked) continue;
    if (base.empty()) base.assign(s.y.size(), 0.0);
    STRATA_CHECK(s.y.size() == base.size(), "stacked series ", s.label, " has ", s.y.size(),
                 " points, the first has ", base.size());
    for (size_t i = 0; i < base.size(); ++i) base[i] += finite(s.y[i]) ? s.y[i] : 0.0;
    tops.push_back(base);
  }
  return tops;
}

struct Legend {
  std::string label;
  Rgb color;
  bool area = false, dashed = false, points = false, line = true;
  double alpha = 1.0;
};

std::vector<Legend> legend_entries(const Panel& p) {
  std::vector<Legend> out, stacked;
  for (const Band& b : p.bands) {
    if (!b.label.empty()) out.push_back({b.label, b.color, true, false, false, false, 0.4});
  }
  for (const Series& s : p.series) {
    if (s.label.empty()) continue;
    const bool area = p.stacked && s.stacked;
    Legend e{
        s.label, s.color, area, s.dashed, s.points, s.line, area ? 0.7 : std::max(0.5, s.alpha)};
    (area ? stacked : out).push_back(e);
  }
  // A stack's legend reads top down, as the areas do.
  out.insert(out.begin(), stacked.rbegin(), stacked.rend());
  return out;
}

// A panel's axes and the room its labels and legend take, computed before drawing so that the
// panels of one figure share their plot area's left and right edges.
struct Scales {
  bool empty = true;
  std::vector<std::vector<double>> tops;  // stack_tops
  Ticks xt, yt;                           // xt.lo, xt.hi: the data's own x range
  double xmag = 0, ymag = 0;
  std::vector<Legend> legend;
  double label_w = 0, legend_w = 0;  // widest y tick label; the legend's column (0: none)
};

Scales scales_of(cairo_t* cr, const Panel& p) {
  Scales sc;
  sc.tops = stack_tops(p);
  Range xr, yr;
  for (const Band& b : p.bands) {
    for (size_t i = 0; i < b.x.size(); ++i) {
      if (finite(b.lo[i]) && finite(b.hi[i])) xr.add(b.x[i]), yr.add(b.lo[i]), yr.add(b.hi[i]);
    }
  }
  size_t stacked_at = 0;
  for (const Series& s : p.series) {
    const bool in_stack = p.stacked && s.stacked;
    const std::vector<double>& ys = in_stack ? sc.tops[stacked_at++] : s.y;
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (finite(s.y[i]) && finite(ys[i])) xr.add(s.x[i]), yr.add(ys[i]);
    }
  }
  sc.empty = xr.empty() || yr.empty();
  if (sc.empty) return sc;
  if (p.y_from_zero) yr.add(0.0);
  // y: rounded out to whole ticks; x: the data's range exactly (steps start at 1, not 0), with
  // the ticks inside it.
  sc.yt = nice_ticks(yr.lo, yr.hi, 6, false);
  sc.xt = nice_ticks(xr.lo, xr.hi, 8, p.x_integer);
  if (xr.hi > xr.lo) {
    sc.xt.lo = xr.lo, sc.xt.hi = xr.hi;
    std::vector<double> inside;
    for (double v : sc.xt.values) {
      if (v >= xr.lo - 1e-9 * sc.xt.step && v <= xr.hi + 1e-9 * sc.xt.step) inside.push_back(v);
    }
    sc.xt.values = inside;
  }
  sc.ymag = std::max(std::abs(sc.yt.lo), std::abs(sc.yt.hi));
  sc.xmag = std::max(std::abs(sc.xt.lo), std::abs(sc.xt.hi));
  set_font(cr, kFont);
  for (double v : sc.yt.values) {
    sc.label_w = std::max(sc.label_w, text_width(cr, tick_label(v, sc.yt.step, sc.ymag)));
  }
  sc.legend = legend_entries(p);
  if (sc.legend.size() > 1) {
    for (const Legend& e : sc.legend) sc.legend_w = std::max(sc.legend_w, text_width(cr, e.label));
    sc.legend_w += 46;
  }
  return sc;
}

// Draws panel p in the box (x0, y0, w, h), its y tick labels label_w wide and its legend
// legend_w (the widest of the figure's panels, so that their plot areas line up).
void draw_panel(cairo_t* cr, const Panel& p, const Scales& sc, double x0, double y0, double w,
                double h, double label_w, double legend_w) {
  const bool empty = sc.empty;
  const std::vector<std::vector<double>>& tops = sc.tops;
  const std::vector<Legend>& legend = sc.legend;
  const Ticks &xt = sc.xt, &yt = sc.yt;
  const double xmag = sc.xmag, ymag = sc.ymag;
  const double left = x0 + 30 + label_w + 8, right = x0 + w - 18 - legend_w;
  const double top = y0 + 38, bottom = y0 + h - 48;
  size_t stacked_at = 0;

  set_font(cr, kTitleFont, true);
  cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
  text(cr, left, y0 + 24, p.title);

  // Plot area.
  cairo_set_source_rgb(cr, 0.985, 0.985, 0.985);
  cairo_rectangle(cr, left, top, right - left, bottom - top);
  cairo_fill(cr);
  if (empty) {
    set_font(cr, kFont + 1);
    cairo_set_source_rgb(cr, 0.35, 0.35, 0.35);
    text(cr, 0.5 * (left + right), 0.5 * (top + bottom), p.note.empty() ? "no data" : p.note, 0.5);
    cairo_set_source_rgb(cr, 0.75, 0.75, 0.75);
    cairo_set_line_width(cr, 1.0);
    cairo_rectangle(cr, left + 0.5, top + 0.5, right - left - 1, bottom - top - 1);
    cairo_stroke(cr);
    return;
  }
  auto px = [&](double v) { return left + (v - xt.lo) / (xt.hi - xt.lo) * (right - left); };
  auto py = [&](double v) { return bottom - (v - yt.lo) / (yt.hi - yt.lo) * (bottom - top); };

  // Grid and tick labels.
  set_font(cr, kFont);
  cairo_set_line_width(cr, 1.0);
  for (double v : yt.values) {
    const double y = std::round(py(v)) + 0.5;
    cairo_set_source_rgb(cr, 0.88, 0.88, 0.88);
    cairo_move_to(cr, left, y);
    cairo_line_to(cr, right, y);
    cairo_stroke(cr);
    cairo_set_source_rgb(cr, 0.25, 0.25, 0.25);
    text(cr, left - 6, y + 4, tick_label(v, yt.step, ymag), 1.0);
  }
  for (double v : xt.values) {
    const double x = std::round(px(v)) + 0.5;
    cairo_set_source_rgb(cr, 0.92, 0.92, 0.92);
    cairo_move_to(cr, x, top);
    cairo_line_to(cr, x, bottom);
    cairo_stroke(cr);
    cairo_set_source_rgb(cr, 0.25, 0.25, 0.25);
    text(cr, x, bottom + 16, tick_label(v, xt.step, xmag), 0.5);
  }
  cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
  text(cr, 0.5 * (left + right), bottom + 36, p.x_label, 0.5);
  cairo_save(cr);
  cairo_translate(cr, x0 + 16, 0.5 * (top + bottom));
  cairo_rotate(cr, -M_PI / 2);
  text(cr, 0, 0, p.y_label, 0.5);
  cairo_restore(cr);

  // The data, clipped to the plot area.
  cairo_save(cr);
  cairo_rectangle(cr, left, top, right - left, bottom - top);
  cairo_clip(cr);
  cairo_set_line_join(cr, CAIRO_LINE_JOIN_ROUND);
  cairo_set_line_cap(cr, CAIRO_LINE_CAP_ROUND);
  for (const Band& b : p.bands) {
    // One filled polygon per run of finite points.
    for (size_t i = 0; i < b.x.size();) {
      size_t j = i;
      while (j < b.x.size() && finite(b.lo[j]) && finite(b.hi[j])) ++j;
      if (j > i) {
        for (size_t k = i; k < j; ++k) cairo_line_to(cr, px(b.x[k]), py(b.hi[k]));
        for (size_t k = j; k-- > i;) cairo_line_to(cr, px(b.x[k]), py(b.lo[k]));
        cairo_close_path(cr);
        set_rgb(cr, b.color, b.alpha);
        cairo_fill(cr);
      }
      i = j + 1;
    }
  }
  stacked_at = 0;
  for (const Series& s : p.series) {
    if (!p.stacked || !s.stacked) continue;
    const std::vector<double>& hi = tops[stacked_at];
    const std::vector<double> zeros(hi.size(), 0.0);
    const std::vector<double>& lo = stacked_at == 0 ? zeros : tops[stacked_at - 1];
    ++stacked_at;
    for (size_t k = 0; k < s.x.size(); ++k) cairo_line_to(cr, px(s.x[k]), py(hi[k]));
    for (size_t k = s.x.size(); k-- > 0;) cairo_line_to(cr, px(s.x[k]), py(lo[k]));
    cairo_close_path(cr);
    set_rgb(cr, s.color, 0.7);
    cairo_fill(cr);
    cairo_new_path(cr);
    for (size_t k = 0; k < s.x.size(); ++k) cairo_line_to(cr, px(s.x[k]), py(hi[k]));
    set_rgb(cr, s.color);
    cairo_set_line_width(cr, 1.2);
    cairo_stroke(cr);
  }
  for (const Series& s : p.series) {
    if (p.stacked && s.stacked) continue;
    set_rgb(cr, s.color, s.alpha);
    cairo_set_line_width(cr, s.width);
    if (s.dashed) {
      const double dash[] = {6.0, 4.0};
      cairo_set_dash(cr, dash, 2, 0);
    }
    size_t run = 0;  // finite points in the current run of the line
    bool lone = false;
    for (size_t i = 0; i <= s.x.size(); ++i) {
      const bool ok = i < s.x.size() && finite(s.y[i]) && finite(s.x[i]);
      if (ok && s.line) {
        if (run == 0)
          cairo_move_to(cr, px(s.x[i]), py(s.y[i]));
        else
          cairo_line_to(cr, px(s.x[i]), py(s.y[i]));
      }
      if (ok) {
        ++run;
        continue;
      }
      if (run == 1) lone = true;  // a point a line alone cannot show
      run = 0;
    }
    if (s.line) cairo_stroke(cr);
    cairo_set_dash(cr, nullptr, 0, 0);
    if (s.points || lone) {
      for (size_t i = 0; i < s.x.size(); ++i) {
        if (!finite(s.y[i]) || !finite(s.x[i])) continue;
        cairo_new_sub_path(cr);
        cairo_arc(cr, px(s.x[i]), py(s.y[i]), s.points ? 3.5 : 2.0, 0, 2 * M_PI);
      }
      cairo_fill(cr);
    }
  }
  cairo_restore(cr);

  // Frame.
  cairo_set_source_rgb(cr, 0.55, 0.55, 0.55);
  cairo_set_line_width(cr, 1.0);
  cairo_rectangle(cr, std::round(left) + 0.5, std::round(top) + 0.5, std::round(right - left) - 1,
                  std::round(bottom - top) - 1);
  cairo_stroke(cr);

  // Legend: one row per entry, as many as fit, then how many were left out.
  if (legend.size() > 1) {
    set_font(cr, kFont);
    const double lx = right + 14, row = 17;
    const size_t fit = size_t(std::max(1.0, std::floor((bottom - top) / row)));
    const size_t shown = legend.size() <= fit ? legend.size() : fit - 1;
    for (size_t i = 0; i < shown; ++i) {
      const Legend& e = legend[i];
      const double y = top + 8 + row * double(i);
      if (e.area) {
        set_rgb(cr, e.color, e.alpha);
        cairo_rectangle(cr, lx, y - 5, 22, 10);
        cairo_fill(cr);
      }
      if (e.line && !e.area) {
        set_rgb(cr, e.color, e.alpha);
        cairo_set_line_width(cr, 2.2);
        if (e.dashed) {
          const double dash[] = {5.0, 3.0};
          cairo_set_dash(cr, dash, 2, 0);
        }
        cairo_move_to(cr, lx, y);
        cairo_line_to(cr, lx + 22, y);
        cairo_stroke(cr);
        cairo_set_dash(cr, nullptr, 0, 0);
      }
      if (e.points) {
        set_rgb(cr, e.color, e.alpha);
        cairo_arc(cr, lx + 11, y, 3.5, 0, 2 * M_PI);
        cairo_fill(cr);
      }
      cairo_set_source_rgb(cr, 0.15, 0.15, 0.15);
      text(cr, lx + 28, y + 4, e.label);
    }
    if (shown < legend.size()) {
      cairo_set_source_rgb(cr, 0.35, 0.35, 0.35);
      text(cr, lx + 28, top + 8 + row * double(shown) + 4,
           "... " + std::to_string(legend.size() - shown) + " more");
    }
  }
}

cairo_status_t append_bytes(void* out, const unsigned char* data, unsigned int n) {
  static_cast<std::string*>(out)->append(reinterpret_cast<const char*>(data), n);
  return CAIRO_STATUS_SUCCESS;
}

}  // namespace

std::string render_png(const Figure& f) {
  STRATA_CHECK(!f.panels.empty() && f.width > 0 && f.panel_height > 0, "an empty figure");
  const int height = f.panel_height * int(f.panels.size());
  Surface surface(cairo_image_surface_create(CAIRO_FORMAT_RGB24, f.width, height),
                  cairo_surface_destroy);
  STRATA_CHECK(cairo_surface_status(surface.get()) == CAIRO_STATUS_SUCCESS, "cairo: cannot make a ",
               f.width, "x", height,
               " image: ", cairo_status_to_string(cairo_surface_status(surface.get())));
  Context cr(cairo_create(surface.get()), cairo_destroy);
  cairo_set_source_rgb(cr.get(), 1, 1, 1);
  cairo_paint(cr.get());
  std::vector<Scales> scales;
  double label_w = 0, legend_w = 0;
  for (const Panel& p : f.panels) {
    scales.push_back(scales_of(cr.get(), p));
    label_w = std::max(label_w, scales.back().label_w);
    legend_w = std::max(legend_w, scales.back().legend_w);
  }
  for (size_t i = 0; i < f.panels.size(); ++i) {
    draw_panel(cr.get(), f.panels[i], scales[i], 0, double(i) * f.panel_height, f.width,
               f.panel_height, label_w, legend_w);
  }
  STRATA_CHECK(cairo_status(cr.get()) == CAIRO_STATUS_SUCCESS,
               "cairo: drawing failed: ", cairo_status_to_string(cairo_status(cr.get())));
  cairo_surface_flush(surface.get());
  std::string png;
  const cairo_status_t st = cairo_surface_write_to_png_stream(surface.get(), append_bytes, &png);
  STRATA_CHECK(st == CAIRO_STATUS_SUCCESS,
               "cairo: PNG encoding failed: ", cairo_status_to_string(st));
  return png;
}

}  // namespace strata::report
