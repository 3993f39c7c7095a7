// Image folders (torchvision's ImageFolder layout), epoch permutations, and
// the synthetic photo-like dataset used by demos and tests.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "fullburn/atomic_file.h"
#include "fullburn/codec.h"
#include "fullburn/image_folder.h"
#include "fullburn/rng.h"

namespace fullburn {
namespace fs = std::filesystem;

namespace {

bool IsImageName(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png";
}

}  // namespace

Result<ImageFolder> ScanImageFolder(const std::string& root) {
  std::error_code ec;
  if (!fs::is_directory(root, ec))
    return Status::NotFound("image folder " + root + " does not exist or is not a directory");
  ImageFolder f;
  std::vector<fs::path> classes;
  for (const fs::directory_entry& e : fs::directory_iterator(root, ec))
    if (e.is_directory(ec)) classes.push_back(e.path());
  if (ec) return Status::IoError("cannot read image folder " + root + ": " + ec.message());
  std::sort(classes.begin(), classes.end());
  for (const fs::path& dir : classes) {
    std::vector<std::string> files;
    for (const fs::directory_entry& e : fs::directory_iterator(dir, ec))
      if (e.is_regular_file(ec) && IsImageName(e.path())) files.push_back(e.path().string());
    if (ec) return Status::IoError("cannot read " + dir.string() + ": " + ec.message());
    if (files.empty()) continue;
    std::sort(files.begin(), files.end());
    int32_t label = static_cast<int32_t>(f.classes.size());
    f.classes.push_back(dir.filename().string());
    for (std::string& file : files) {
      f.files.push_back(std::move(file));
      f.labels.push_back(label);
    }
  }
  if (f.files.empty())
    return Status::NotFound("image folder " + root +
                            " has no JPEG or PNG files in class subfolders (expected ROOT/<class>/*.jpg); "
                            "create one with 'fullburn make-dataset images DIR'");
  return f;
}

Status ReadWholeFile(const std::string& path, std::vector<uint8_t>* out) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::IoError("cannot open");
  off_t size = ::lseek(fd, 0, SEEK_END);
  if (size < 0) {
    ::close(fd);
    return Status::IoError("cannot size");
  }
  out->resize(static_cast<size_t>(size));
  size_t done = 0;
  while (done < out->size()) {
    ssize_t n = ::pread(fd, out->data() + done, out->size() - done, static_cast<off_t>(done));
    if (n <= 0) {
      ::close(fd);
      return Status::IoError("cannot read");
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return Status::Ok();
}

std::vector<int64_t> EpochPermutation(int64_t n, uint64_t seed, int epoch, bool shuffle) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
  if (!shuffle) return order;
  SplitMix rng{seed * 0x100000001B3ull + static_cast<uint64_t>(epoch) + 1};
  for (int64_t i = n - 1; i > 0; --i) {
    int64_t j = static_cast<int64_t>(rng.Next() % static_cast<uint64_t>(i + 1));
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
  }
  return order;
}

namespace {

struct Rgb {
  double r, g, b;
};

Rgb Hue(double h, double light) {
  auto f = [&](double n) {
    double k = std::fmod(n + h * 12.0, 12.0);
    return light - 0.45 * std::max(-1.0, std::min({k - 3.0, 9.0 - k, 1.0}));
  };
  return Rgb{255 * f(0), 255 * f(8), 255 * f(4)};
}

// Is (x, y) inside the class's shape centred at (cx, cy) with radius r?
bool InShape(int shape, double x, double y, double cx, double cy, double r) {
  double dx = x - cx, dy = y - cy;
  switch (shape) {
    case 0: return dx * dx + dy * dy < r * r;                               // disc
    case 1: return std::fabs(dx) < r && std::fabs(dy) < r;                  // square
    case 2: return dy > -r && dy < r && std::fabs(dx) < (r - dy) / 2;       // triangle
    case 3: { double d = std::sqrt(dx * dx + dy * dy); return d < r && d > r * 0.6; }  // ring
    default: return std::fabs(dx) < r * 0.3 || std::fabs(dy) < r * 0.3 ? std::fabs(dx) < r && std::fabs(dy) < r : false;  // cross
  }
}

void RenderImage(int cls, int classes, int w, int h, SplitMix* rng, std::vector<uint8_t>* px) {
  px->resize(static_cast<size_t>(w) * h * 3);
  Rgb fg = Hue(static_cast<double>(cls) / classes, 0.5);
  Rgb bg = Hue(std::fmod(static_cast<double>(cls) / classes + 0.5 + 0.2 * rng->Uniform(), 1.0), 0.35);
  double freq = 0.01 + 0.004 * (cls % 7);  // class texture frequency
  double phase = rng->Uniform() * 6.28, angle = rng->Uniform() * 3.14;
  double fx = std::cos(angle) * freq, fy = std::sin(angle) * freq;
  double r = std::min(w, h) * (0.18 + 0.15 * rng->Uniform());
  double cx = r + rng->Uniform() * (w - 2 * r), cy = r + rng->Uniform() * (h - 2 * r);
  int shape = cls % 5;
  for (int y = 0; y < h; ++y) {
    double shade = 0.75 + 0.25 * y / h;  // a soft vertical gradient, like light
    for (int x = 0; x < w; ++x) {
      double t = 0.5 + 0.5 * std::sin(x * fx + y * fy + phase);
      Rgb c = InShape(shape, x, y, cx, cy, r) ? fg : Rgb{bg.r * (0.7 + 0.3 * t), bg.g * (0.7 + 0.3 * t), bg.b * (0.7 + 0.3 * t)};
      double noise = (static_cast<double>(rng->Next() & 31) - 15.5);
      uint8_t* p = px->data() + (static_cast<size_t>(y) * w + x) * 3;
      p[0] = static_cast<uint8_t>(std::clamp(c.r * shade + noise, 0.0, 255.0));
      p[1] = static_cast<uint8_t>(std::clamp(c.g * shade + noise, 0.0, 255.0));
      p[2] = static_cast<uint8_t>(std::clamp(c.b * shade + noise, 0.0, 255.0));
    }
  }
}

}  // namespace

Status MakeSyntheticImages(const std::string& dir, const SyntheticImagesOptions& o) {
  if (o.classes < 1 || o.per_class < 1 || o.width < 8 || o.height < 8 || o.quality < 1 ||
      o.quality > 100)
    return Status::InvalidArgument(
        "make-dataset images needs classes >= 1, per-class >= 1, a size of at least 8x8 and a "
        "quality of 1 to 100");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Status::IoError("cannot create " + dir + ": " + ec.message());
  std::vector<uint8_t> px;
  for (int c = 0; c < o.classes; ++c) {
    char name[32];
    std::snprintf(name, sizeof name, "class_%03d", c);
    fs::path class_dir = fs::path(dir) / name;
    fs::create_directories(class_dir, ec);
    if (ec) return Status::IoError("cannot create " + class_dir.string() + ": " + ec.message());
    for (int i = 0; i < o.per_class; ++i) {
      SplitMix rng{o.seed * 1000003ull + static_cast<uint64_t>(c) * 100003ull + static_cast<uint64_t>(i)};
      RenderImage(c, o.classes, o.width, o.height, &rng, &px);
      Result<std::vector<uint8_t>> jpeg = EncodeJpeg(px.data(), o.width, o.height, o.quality);
      if (!jpeg.ok()) return jpeg.status();
      char file[32];
      std::snprintf(file, sizeof file, "img_%05d.jpg", i);
      // The images already there are whole; no fragment joins them.
      std::string path = (class_dir / file).string();
      Status written = WriteFileAtomically(
          path, std::string_view(reinterpret_cast<const char*>(jpeg->data()), jpeg->size()));
      if (!written.ok()) return written;
    }
  }
  return Status::Ok();
}

}  // namespace fullburn
