// A small line-chart renderer on cairo for strata report: one or more panels stacked vertically in
// one PNG, each with its title, axes with nice ticks (1, 2 or 5 times a power of ten), axis labels,
// a light grid, any number of series (lines, points, or both), min–max bands, an optional stacked
// area mode, and a legend to the right of the plot area when a panel has more than one entry. A
// panel with nothing to draw shows its `note` instead. Values that are not finite break a line
// (they are never drawn).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strata::report {

struct Rgb {
  double r = 0, g = 0, b = 0;
};
// The palette's i-th colour (20 distinct ones, then again).
Rgb palette(size_t i);

struct Series {
  std::string label;  // "" keeps it out of the legend
  std::vector<double> x, y;
  Rgb color;
  bool line = true, points = false;  // a line through the points, markers at them, or both
  double width = 1.8;                // line width in pixels
  double alpha = 1.0;
  bool dashed = false;
  // In a stacked panel: false draws this series as a plain line over the stack.
  bool stacked = true;
};

// A filled band between lo and hi at x (e.g. min..max over ranks).
struct Band {
  std::string label;
  std::vector<double> x, lo, hi;
  Rgb color;
  double alpha = 0.25;
};

struct Panel {
  std::string title, x_label, y_label;
  std::vector<Band> bands;     // drawn first
  std::vector<Series> series;  // in order, later ones on top
  bool y_from_zero = false;    // the y axis includes 0
  bool x_integer = true;       // x ticks are whole numbers (steps)
  // Series marked stacked are drawn as filled areas, each on top of the ones before (their x
  // must be equal); the legend lists them top first.
  bool stacked = false;
  std::string note;  // shown in the plot area when no series or band has a finite point
};

struct Figure {
  std::vector<Panel> panels;
  int width = 960;
  int panel_height = 340;
};

// Ticks covering [lo, hi]: about `target` values, each a multiple of a nice step; the first tick
// is <= lo and the last >= hi. `integer` keeps the step >= 1. lo == hi is widened around the value.
struct Ticks {
  double lo = 0, hi = 1, step = 1;
  std::vector<double> values;
};
Ticks nice_ticks(double lo, double hi, int target, bool integer);
// A tick's label: fixed decimals enough for `step`; k/M/G above 10^4; scientific below 10^-3.
std::string tick_label(double v, double step, double magnitude);

// The figure as PNG bytes (cairo's encoder). Throws strata::Error when cairo fails.
std::string render_png(const Figure& f);

}  // namespace strata::report
