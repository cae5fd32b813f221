#include "moetron/data/scene_images.h"

#include <algorithm>
#include <cmath>

#include "moetron/core/error.h"

namespace moetron::data {

namespace {

constexpr int kPlacementTries = 200;

uint32_t below(PhiloxStream& rng, uint32_t n) {
  return rng.next_u32() % n;
}

bool is_heldout(const std::vector<std::pair<int, ShapeKind>>& heldout, int colour, ShapeKind k) {
  return std::find(heldout.begin(), heldout.end(), std::make_pair(colour, k)) != heldout.end();
}

// Whether pixel (x, y) lies inside shape s.
bool covers(const SceneShape& s, int64_t x, int64_t y) {
  const double dx = static_cast<double>(x - s.cx), dy = static_cast<double>(y - s.cy);
  const auto r = static_cast<double>(s.radius);
  switch (s.kind) {
    case ShapeKind::circle:
      return dx * dx + dy * dy <= (r + 0.5) * (r + 0.5);
    case ShapeKind::square:
      return std::abs(dx) <= 0.8 * r && std::abs(dy) <= 0.8 * r;
    case ShapeKind::diamond:
      return std::abs(dx) + std::abs(dy) <= r + 0.5;
    case ShapeKind::triangle: {
      // Apex at the top, base 0.8 r below the centre.
      if (dy < -r || dy > 0.8 * r) return false;
      return std::abs(dx) <= (dy + r) / 1.8 + 0.5;
    }
  }
  return false;
}

// Boxes [c - r - 1, c + r + 1] must not meet: a one-pixel gap between shapes.
bool overlaps(const SceneShape& a, const SceneShape& b) {
  const int64_t gap = a.radius + b.radius + 2;
  return std::abs(a.cx - b.cx) < gap && std::abs(a.cy - b.cy) < gap;
}

const char* relation(const SceneShape& a, const SceneShape& b) {
  const int64_t dx = b.cx - a.cx, dy = b.cy - a.cy;
  if (dx >= std::abs(dy)) return "left of";
  return dy > 0 ? "above" : "below";
}

bool place(PhiloxStream& rng, int64_t size, std::vector<SceneShape>& shapes) {
  for (size_t i = 0; i < shapes.size(); ++i) {
    SceneShape& s = shapes[i];
    bool placed = false;
    for (int t = 0; t < kPlacementTries && !placed; ++t) {
      const auto span = static_cast<uint32_t>(size - 2 * s.radius - 2);
      s.cx = s.radius + 1 + below(rng, span);
      s.cy = s.radius + 1 + below(rng, span);
      placed = std::none_of(shapes.begin(), shapes.begin() + static_cast<std::ptrdiff_t>(i),
                            [&](const SceneShape& o) { return overlaps(o, s); });
    }
    if (!placed) return false;
  }
  return true;
}

Image draw(PhiloxStream& rng, int64_t size, const std::vector<SceneShape>& shapes) {
  Image img;
  img.height = img.width = size;
  img.channels = 3;
  img.pixels.resize(static_cast<size_t>(size * size * 3));
  const int base = 24 + static_cast<int>(below(rng, 24));  // dark background, varied
  for (auto& p : img.pixels) p = static_cast<uint8_t>(base + static_cast<int>(below(rng, 9)) - 4);
  for (const SceneShape& s : shapes) {
    const SceneColour& c = scene_colours()[static_cast<size_t>(s.colour)];
    const int jitter = static_cast<int>(below(rng, 31)) - 15;  // brightness varies per shape
    const uint8_t rgb[3] = {c.r, c.g, c.b};
    for (int64_t y = s.cy - s.radius; y <= s.cy + s.radius; ++y)
      for (int64_t x = s.cx - s.radius; x <= s.cx + s.radius; ++x) {
        if (!covers(s, x, y)) continue;
        for (int ch = 0; ch < 3; ++ch)
          img.pixels[static_cast<size_t>((y * size + x) * 3 + ch)] =
              static_cast<uint8_t>(std::clamp(rgb[ch] + jitter, 0, 255));
      }
  }
  return img;
}

}  // namespace

const std::vector<SceneColour>& scene_colours() {
  static const std::vector<SceneColour> colours = {
      {"red", 220, 30, 30},     {"green", 30, 180, 40},   {"blue", 40, 70, 230},
      {"yellow", 235, 220, 40}, {"purple", 150, 50, 200}, {"orange", 245, 140, 20},
      {"white", 235, 235, 235}, {"cyan", 40, 210, 220}};
  return colours;
}

const char* shape_name(ShapeKind k) {
  switch (k) {
    case ShapeKind::circle:
      return "circle";
    case ShapeKind::square:
      return "square";
    case ShapeKind::triangle:
      return "triangle";
    case ShapeKind::diamond:
      return "diamond";
  }
  return "?";
}

const char* size_name(bool large) {
  return large ? "large" : "small";
}

std::vector<std::pair<int, ShapeKind>> heldout_combinations(uint64_t seed) {
  PhiloxStream rng(seed, "scene.heldout");
  std::vector<int> colours(scene_colours().size());
  for (size_t i = 0; i < colours.size(); ++i) colours[i] = static_cast<int>(i);
  for (size_t i = colours.size() - 1; i > 0; --i)  // Fisher-Yates
    std::swap(colours[i], colours[rng.next_u32() % (i + 1)]);
  std::vector<std::pair<int, ShapeKind>> out;
  for (int k = 0; k < kNumShapeKinds; ++k)
    out.emplace_back(colours[static_cast<size_t>(k)], static_cast<ShapeKind>(k));
  return out;
}

std::string describe_scene(const std::vector<SceneShape>& shapes) {
  std::string out;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const SceneShape& s = shapes[i];
    if (i == 1) out += str_cat(" ", relation(shapes[0], s), " ");
    if (i >= 2) out += str_cat(" which is ", relation(shapes[i - 1], s), " ");
    out += str_cat("a ", size_name(s.large), " ",
                   scene_colours()[static_cast<size_t>(s.colour)].name, " ", shape_name(s.kind));
  }
  return out;
}

Scene generate_scene(PhiloxStream& rng, const SceneOptions& opts,
                     const std::vector<std::pair<int, ShapeKind>>& heldout, bool heldout_scene) {
  MOETRON_CHECK(opts.size >= 16, "scene images must be at least 16 pixels wide, got ", opts.size);
  MOETRON_CHECK(opts.min_shapes >= 1 && opts.min_shapes <= opts.max_shapes && opts.max_shapes <= 3,
                "shapes per scene must satisfy 1 <= min <= max <= 3, got ", opts.min_shapes, "..",
                opts.max_shapes);
  MOETRON_CHECK(!heldout_scene || !heldout.empty(), "a held-out scene needs held-out combinations");
  const auto n_colours = static_cast<uint32_t>(scene_colours().size());
  const int64_t small_r = opts.size / 8, large_r = (opts.size * 7) / 32;  // 4 and 7 at 32 px
  while (true) {
    const int n =
        opts.min_shapes +
        static_cast<int>(below(rng, static_cast<uint32_t>(opts.max_shapes - opts.min_shapes + 1)));
    std::vector<SceneShape> shapes(static_cast<size_t>(n));
    for (size_t i = 0; i < shapes.size(); ++i) {
      SceneShape& s = shapes[i];
      if (heldout_scene && i == 0) {  // the unseen combination
        const auto& [colour, kind] = heldout[below(rng, static_cast<uint32_t>(heldout.size()))];
        s.colour = colour, s.kind = kind;
      } else {
        do {
          s.colour = static_cast<int>(below(rng, n_colours));
          s.kind = static_cast<ShapeKind>(below(rng, kNumShapeKinds));
        } while (!heldout_scene && is_heldout(heldout, s.colour, s.kind));
      }
      s.large = below(rng, 2) == 1;
      s.radius = s.large ? large_r : small_r;
    }
    if (!place(rng, opts.size, shapes)) continue;  // too crowded: draw another scene
    std::sort(shapes.begin(), shapes.end(), [](const SceneShape& a, const SceneShape& b) {
      return a.cx != b.cx ? a.cx < b.cx : a.cy < b.cy;
    });
    Scene scene;
    scene.image = draw(rng, opts.size, shapes);
    scene.caption = describe_scene(shapes);
    scene.shapes = std::move(shapes);
    return scene;
  }
}

}  // namespace moetron::data
