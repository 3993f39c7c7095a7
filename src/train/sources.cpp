// Batch sources of the trainer.
#include "sources.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace fullburn {
namespace {

Status MakeDirs(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) return Status::IoError("cannot create " + path + ": " + ec.message() + "; set data.path");
  return Status::Ok();
}

// The ranks of a job, and jobs that share a store, may all find a default
// dataset missing at once; made side by side, their renames of one temporary
// file failed. One process makes it under an exclusive lock on the datasets
// directory while the others wait and then find it complete. The kernel drops
// the lock when its holder dies, so a maker killed mid-way blocks no one.
class DatasetsLock {
 public:
  static Result<std::unique_ptr<DatasetsLock>> Take(const std::string& dir) {
    if (Status s = MakeDirs(dir); !s.ok()) return s;
    std::string path = dir + "/.lock";
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
      return Status::IoError("cannot create " + path + ": " + std::strerror(errno) +
                             "; make the directory writable or set data.path");
    while (::flock(fd, LOCK_EX) != 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      return Status::IoError("cannot lock " + path + ": " + std::strerror(err) + "; set data.path");
    }
    return std::unique_ptr<DatasetsLock>(new DatasetsLock(fd));
  }
  ~DatasetsLock() { ::close(fd_); }  // closing the file drops the lock

 private:
  explicit DatasetsLock(int fd) : fd_(fd) {}
  int fd_;
};

class ImageSource : public BatchSource {
 public:
  explicit ImageSource(std::unique_ptr<Loader> l) : loader_(std::move(l)) {}
  int64_t batches_per_epoch() const override { return loader_->batches_per_epoch(); }
  void StartEpoch(int epoch, int64_t consumed) override { loader_->StartEpoch(epoch, 0, consumed); }
  bool Next(TrainBatch* b) override {
    DeviceBatch d;
    if (!loader_->Next(&d)) return false;
    b->inputs = d.images;
    b->targets = d.labels;
    b->samples = d.images.size(0);
    return true;
  }
  Status status() const override { return loader_->status(); }
  std::optional<LoaderStats> loader_stats() const override { return loader_->stats(); }
  int64_t num_classes() const override { return loader_->num_classes(); }
  int64_t in_features() const override { return in_features_; }
  int64_t in_features_ = 0;

 private:
  std::unique_ptr<Loader> loader_;
};

// Whole dataset in device memory; batches are index_select by the epoch's
// permutation, so the input cost is what a TensorDataset would have at best.
class TensorSource : public BatchSource {
 public:
  TensorSource(torch::Tensor x, torch::Tensor y, int batch, uint64_t seed, int64_t classes,
               bool tokens, int rank, int world, bool keep_last)
      : x_(std::move(x)),
        y_(std::move(y)),
        batch_(batch),
        seed_(seed),
        classes_(classes),
        tokens_(tokens),
        rank_(rank),
        world_(world),
        keep_last_(keep_last) {}
  int64_t batches_per_epoch() const override { return Batches(x_.size(0)); }
  void StartEpoch(int epoch, int64_t consumed) override {
    std::vector<int64_t> all = EpochPermutation(x_.size(0), seed_, epoch), perm;
    const int64_t n = x_.size(0), skip = std::max<int64_t>(0, std::min(consumed, n));
    // Every world-th sample from this rank's offset (DistributedSampler): the
    // ranks' k-th batches together are one process's k-th batch of world x batch.
    for (int64_t i = skip + rank_; i < n; i += world_) perm.push_back(all[static_cast<size_t>(i)]);
    order_ = torch::from_blob(perm.data(), {static_cast<int64_t>(perm.size())}, torch::kLong)
                 .to(x_.device(), /*non_blocking=*/false, /*copy=*/true);
    epoch_batches_ = Batches(n - skip);
    next_ = 0;
  }
  bool Next(TrainBatch* b) override {
    if (next_ >= epoch_batches_) return false;
    torch::Tensor idx =
        order_.slice(0, next_ * batch_, std::min((next_ + 1) * batch_, order_.size(0)));
    b->inputs = x_.index_select(0, idx);
    b->targets = y_.index_select(0, idx);
    b->samples = idx.size(0);
    ++next_;
    return true;
  }
  int64_t num_classes() const override { return classes_; }
  int64_t in_features() const override {
    return tokens_ || x_.size(0) == 0 ? 0 : x_.numel() / x_.size(0);
  }
  bool per_position_targets() const override { return y_.dim() > 1; }

 private:
  // Training: whole batches the same on every rank (a collective per step).
  // Evaluation (keep_last): every sample of this rank's share, the last batch short.
  int64_t Batches(int64_t samples) const {
    if (!keep_last_) return samples / world_ / batch_;
    int64_t mine = samples > rank_ ? (samples - rank_ + world_ - 1) / world_ : 0;
    return (mine + batch_ - 1) / batch_;
  }

  torch::Tensor x_, y_, order_;
  int batch_;
  uint64_t seed_;
  int64_t classes_;
  bool tokens_;
  int rank_, world_;
  bool keep_last_;
  int64_t next_ = 0, epoch_batches_ = 0;
};

class TokenSource : public BatchSource {
 public:
  TokenSource(std::unique_ptr<TokenShards> shards, int batch, uint64_t seed, torch::Device device,
              int vocab, int rank, int world)
      : shards_(std::move(shards)),
        batch_(batch),
        seed_(seed),
        device_(device),
        vocab_(vocab),
        rank_(rank),
        world_(world) {}
  int64_t batches_per_epoch() const override {
    return std::max<int64_t>(
        1, shards_->tokens() / (static_cast<int64_t>(batch_) * shards_->seq_len() * world_));
  }
  // Windows are drawn by a global batch index, so "consumed" counts batches
  // of this size: a resume with another per-rank batch continues the index.
  void StartEpoch(int epoch, int64_t consumed) override {
    epoch_ = epoch;
    const int64_t all = batches_per_epoch() * world_;
    base_ = std::max<int64_t>(0, std::min(consumed / batch_, all));
    epoch_batches_ = (all - base_) / world_;
    next_ = 0;
  }
  bool Next(TrainBatch* b) override {
    if (next_ >= epoch_batches_) return false;
    int t = shards_->seq_len();
    torch::Tensor x = torch::empty({batch_, t}, torch::kInt),
                  y = torch::empty({batch_, t}, torch::kInt);
    // Ranks draw disjoint window sets: batch index k of rank r is k x world + r.
    shards_->Batch(seed_, epoch_ * batches_per_epoch() * world_ + base_ + next_ * world_ + rank_,
                   batch_, x.data_ptr<int32_t>(), y.data_ptr<int32_t>());
    b->inputs = x.to(device_, torch::kLong);
    b->targets = y.to(device_, torch::kLong);
    b->samples = batch_;
    ++next_;
    return true;
  }
  int64_t num_classes() const override { return vocab_; }
  int64_t in_features() const override { return 0; }
  bool per_position_targets() const override { return true; }

 private:
  std::unique_ptr<TokenShards> shards_;
  int batch_;
  uint64_t seed_;
  torch::Device device_;
  int vocab_;
  int rank_, world_;
  int epoch_ = 0;
  int64_t next_ = 0, base_ = 0, epoch_batches_ = 0;
};

// mlp: features with a fixed random linear rule; lstm: token sequences whose
// class is the sum of the last two tokens modulo the class count; resnet:
// noise images whose class sets each channel's mean (held on the device, so a
// run measures the model alone, as the throughput benchmarks of the field do).
std::unique_ptr<BatchSource> Synthetic(const TrainSettings& c, const SourceSpec& s) {
  int64_t n = s.train ? c.data.synthetic_samples
                      : std::max<int64_t>(s.batch_size, c.data.synthetic_samples / 8);
  int64_t classes = c.data.classes;
  auto rule = torch::make_generator<at::CPUGeneratorImpl>(c.train.seed + 7);
  auto gen =
      torch::make_generator<at::CPUGeneratorImpl>(c.train.seed * 2 + (s.train ? 1 : 2));
  torch::Tensor x, y;
  bool tokens = c.model.name == "lstm";
  if (tokens) {
    x = torch::randint(c.data.vocab, {n, c.data.seq_len}, gen, torch::kLong);
    y = (x.select(1, -1) + x.select(1, -2)).remainder(classes);
  } else if (c.model.name.rfind("resnet", 0) == 0) {
    int64_t side = c.data.image_size;
    torch::Tensor means = torch::randn({classes, 3, 1, 1}, rule);
    y = torch::randint(classes, {n}, gen, torch::kLong);
    x = torch::randn({n, 3, side, side}, gen).mul_(0.5).add_(means.index_select(0, y));
    if (s.channels_last) x = x.contiguous(torch::MemoryFormat::ChannelsLast);
  } else {
    torch::Tensor w = torch::randn({c.data.features, classes}, rule);
    x = torch::randn({n, c.data.features}, gen);
    y = x.matmul(w).argmax(1);
  }
  return std::make_unique<TensorSource>(x.to(s.device), y.to(s.device), s.batch_size, s.seed,
                                        classes, tokens, s.rank, s.world_size,
                                        /*keep_last=*/!s.train);
}

// A program's own samples (C++ API; CheckTensorData passed), moved to the
// device whole.
Result<std::unique_ptr<BatchSource>> ProgramTensors(const TrainSettings& c, const SourceSpec& s) {
  if (!s.tensors)
    return Status::InvalidArgument(
        "data.source = tensors takes the samples a program hands over through the C++ API "
        "(TrainerOptions::train_data): choose images, tokens or synthetic");
  torch::Tensor x = s.tensors->inputs.to(s.device);
  torch::Tensor y = s.tensors->targets.to(s.device, torch::kLong);
  if (s.channels_last && x.dim() == 4) x = x.contiguous(torch::MemoryFormat::ChannelsLast);
  // A language model's outputs are its vocabulary (as for token shards).
  int64_t classes =
      y.dim() > 1 && !x.is_floating_point() ? c.data.vocab : y.max().item<int64_t>() + 1;
  auto src = std::make_unique<TensorSource>(x, y, s.batch_size, s.seed, classes,
                                            /*tokens=*/!x.is_floating_point(), s.rank, s.world_size,
                                            /*keep_last=*/!s.train);
  if (src->batches_per_epoch() == 0)
    return Status::InvalidArgument(
        "the tensors handed over hold " + std::to_string(x.size(0)) +
        " samples, fewer than one batch of " + std::to_string(s.batch_size) +
        (s.world_size > 1 ? " on each of " + std::to_string(s.world_size) + " ranks" : "") +
        ": lower train.batch_size or hand over more samples");
  return std::unique_ptr<BatchSource>(std::move(src));
}

// A program's own Dataset through DatasetLoader (worker threads, slots).
class DatasetSource : public BatchSource {
 public:
  DatasetSource(std::unique_ptr<DatasetLoader> l, int64_t classes)
      : loader_(std::move(l)), classes_(classes) {}
  int64_t batches_per_epoch() const override { return loader_->batches_per_epoch(); }
  void StartEpoch(int epoch, int64_t consumed) override { loader_->StartEpoch(epoch, 0, consumed); }
  bool Next(TrainBatch* b) override {
    TensorBatch t;
    if (!loader_->Next(&t)) return false;
    b->inputs = t.inputs;
    b->targets = t.targets;
    b->samples = t.inputs.size(0);
    return true;
  }
  Status status() const override { return loader_->status(); }
  std::optional<LoaderStats> loader_stats() const override { return loader_->stats(); }
  int64_t num_classes() const override { return classes_; }
  int64_t in_features() const override {
    const torch::Tensor& x = loader_->first().input;
    return x.is_floating_point() ? x.numel() : 0;
  }
  bool per_position_targets() const override { return loader_->first().target.dim() > 0; }

 private:
  std::unique_ptr<DatasetLoader> loader_;
  int64_t classes_;
};

Result<std::unique_ptr<BatchSource>> ProgramDataset(const TrainSettings& c, const SourceSpec& s) {
  if (!s.dataset)
    return Status::InvalidArgument(
        "data.source = dataset takes a Dataset a program hands over through the C++ API "
        "(TrainerOptions::dataset): choose images, tokens or synthetic");
  DatasetLoaderOptions o;
  o.batch_size = s.batch_size;
  o.threads = static_cast<int>(c.data.threads);
  o.cpu_budget = s.loader_cpu_budget;
  o.prefetch = static_cast<int>(c.data.prefetch);
  o.seed = s.seed;
  o.rank = s.rank;
  o.world_size = s.world_size;
  o.keep_last = !s.train;  // evaluation reads every held-out sample once
  o.device = s.device;
  o.channels_last = s.channels_last;
  auto loader = DatasetLoader::Open(s.dataset, o);
  if (!loader.ok()) return loader.status();
  // A built-in model's outputs: a language model's vocabulary, else the classes.
  const Sample& first = (*loader)->first();
  bool tokens = first.target.dim() > 0 && !first.input.is_floating_point();
  int64_t classes = tokens ? c.data.vocab : c.data.classes;
  return std::unique_ptr<BatchSource>(new DatasetSource(std::move(*loader), classes));
}

}  // namespace

Result<TensorData> FirstSampleAsBatch(Dataset& dataset, uint64_t seed) {
  if (dataset.size() <= 0)
    return Status::InvalidArgument("the dataset is empty (Dataset::size() is " +
                                   std::to_string(dataset.size()) + ")");
  try {
    torch::NoGradGuard no_grad;
    Sample s = dataset.Get(0, seed);
    if (!s.input.defined() || !s.target.defined())
      return Status::InvalidArgument(
          "dataset sample 0 has no input or no target: Dataset::Get must give both");
    torch::Tensor target = s.target.numel() == 1 && s.target.dim() <= 1 ? s.target.reshape({1})
                                                                        : s.target.unsqueeze(0);
    return TensorData{s.input.unsqueeze(0), target};
  } catch (const std::exception& e) {
    std::string what = e.what();
    return Status::InvalidArgument("dataset sample 0: " + what.substr(0, what.find('\n')));
  }
}

std::string CheckTensorData(const TensorData& d) {
  if (!d.inputs.defined() || !d.targets.defined())
    return "TensorData needs both inputs and targets";
  if (d.inputs.dim() == 0 || d.targets.dim() == 0)
    return "TensorData's inputs and targets need a first dimension of samples";
  if (d.inputs.size(0) != d.targets.size(0))
    return "TensorData holds " + std::to_string(d.inputs.size(0)) + " inputs but " +
           std::to_string(d.targets.size(0)) +
           " targets: give one target (or one per position) per sample";
  if (d.inputs.size(0) == 0) return "TensorData holds no samples";
  if (d.targets.is_floating_point() || d.targets.is_complex() ||
      d.targets.scalar_type() == torch::kBool)
    return std::string("TensorData's targets are ") + c10::toString(d.targets.scalar_type()) +
           ": give class indices as integers (torch::kLong)";
  if (int64_t low = d.targets.min().item<int64_t>(); low < 0)
    return "TensorData's targets hold the class index " + std::to_string(low) +
           ": class indices count from 0";
  return "";
}

std::string CheckTensorsFitModel(const TrainSettings& c, const TensorData& d) {
  const std::string& model = c.model.name;
  const torch::Tensor &x = d.inputs, &y = d.targets;
  bool floats = x.is_floating_point(), tokens = model == "lstm" || model == "gpt";
  std::string wants;
  if (model.rfind("resnet", 0) == 0 && !(floats && x.dim() == 4 && x.size(1) == 3))
    wants = "float images [N, 3, H, W]";
  else if (model == "mlp" && !floats)
    wants = "float features [N, ...]";
  else if (model == "lstm" && (floats || x.dim() != 2 || y.dim() != 1))
    wants = "token sequences [N, T] (integers) with one class per sequence [N]";
  else if (model == "gpt" && (floats || x.dim() != 2 || !y.sizes().equals(x.sizes())))
    wants = "token sequences [N, T] (integers) with the next token of each position [N, T]";
  if (!wants.empty())
    return fmt::format(
        "model.name = {} takes {}; the tensors handed over are inputs {} {} and targets {}: hand "
        "over data of that shape, or the program's own network (TrainerOptions::model)",
        model, wants, c10::toString(x.scalar_type()), fmt::join(x.sizes(), "x"),
        fmt::join(y.sizes(), "x"));
  if (!tokens) return "";
  int64_t vocab = c.data.vocab, top = x.max().item<int64_t>();
  if (model == "gpt") top = std::max(top, y.max().item<int64_t>());
  if (top >= vocab)
    return fmt::format("the tensors hold token {}, beyond data.vocab = {}: set data.vocab = {}",
                       top, vocab, top + 1);
  if (model == "gpt" && x.size(1) > c.data.seq_len)
    return fmt::format(
        "the tensors hold sequences of {} tokens, longer than data.seq_len = {} (the model's "
        "positions): set data.seq_len = {}",
        x.size(1), c.data.seq_len, x.size(1));
  return "";
}

Result<std::unique_ptr<BatchSource>> OpenSource(const TrainSettings& c, const SourceSpec& s) {
  const std::string& kind = c.data.source;
  if (kind == "synthetic") return Synthetic(c, s);
  if (kind == "tensors") return ProgramTensors(c, s);
  if (kind == "dataset") return ProgramDataset(c, s);
  if (kind == "tokens") {
    auto shards = TokenShards::Open({s.path}, static_cast<int>(c.data.seq_len));
    if (!shards.ok()) return shards.status();
    return std::unique_ptr<BatchSource>(
        new TokenSource(std::move(*shards), s.batch_size, s.seed + (s.train ? 0 : 1000003),
                        s.device, static_cast<int>(c.data.vocab), s.rank, s.world_size));
  }
  TorchLoaderOptions t;
  t.loader.root = s.path;
  t.loader.batch_size = s.batch_size;
  t.loader.threads = static_cast<int>(c.data.threads);
  t.loader.cpu_budget = s.loader_cpu_budget;
  t.loader.prefetch = static_cast<int>(c.data.prefetch);
  t.loader.cache_bytes = c.data.cache_mb << 20;
  t.loader.out_w = t.loader.out_h = static_cast<int>(c.data.image_size);
  t.loader.eval_resize = static_cast<int>(c.data.image_size * 256 / 224);
  t.loader.train = s.train;
  t.loader.keep_last = !s.train;  // evaluation reads every held-out image once
  t.loader.layout = Layout::kNCHW;
  t.loader.seed = s.seed;
  t.loader.on_bad_sample =
      c.data.bad_samples == "skip" ? BadSamplePolicy::kSkip : BadSamplePolicy::kFail;
  t.loader.bad_sample_fix =
      "set data.bad_samples = skip to train on without it, or remove or replace the file";
  t.loader.rank = s.rank;
  t.loader.world_size = s.world_size;
  t.device = s.device;
  t.channels_last = s.channels_last;
  auto loader = Loader::Open(t);
  if (!loader.ok()) return loader.status();
  if ((*loader)->batches_per_epoch() == 0)
    return Status::InvalidArgument(
        "the data at " + s.path + " has fewer samples than one batch of " +
        std::to_string(s.batch_size) + ": lower train.batch_size or add data");
  auto src = std::make_unique<ImageSource>(std::move(*loader));
  src->in_features_ = 3 * c.data.image_size * c.data.image_size;
  return std::unique_ptr<BatchSource>(std::move(src));
}

std::string DefaultImagesPath(const std::string& dir, int classes, bool val) {
  return dir + "/synthetic-images-" + std::to_string(classes) + "c" + (val ? "/val" : "/train");
}

Result<std::string> DefaultImages(const std::string& dir, int classes, bool val) {
  std::string split = DefaultImagesPath(dir, classes, val);
  // The marker is written last: a half-made set (killed mid-way) is remade.
  std::string done = split + "/.complete";
  if (std::filesystem::exists(done)) return split;
  auto lock = DatasetsLock::Take(dir);
  if (!lock.ok()) return lock.status();
  if (std::filesystem::exists(done)) return split;  // made while this process waited
  if (Status s = MakeDirs(split); !s.ok()) return s;
  SyntheticImagesOptions o;
  o.classes = classes;
  o.per_class = val ? 50 : 260;
  o.width = 128;
  o.height = 96;
  o.seed = val ? 1 : 0;
  std::fprintf(stderr, "fullburn: creating the synthetic %s images in %s (first run only)\n",
               val ? "held-out" : "training", split.c_str());
  if (Status s = MakeSyntheticImages(split, o); !s.ok()) return s;
  std::ofstream(done) << "ok\n";
  return split;
}

Result<std::string> DefaultTokens(const std::string& dir, int vocab) {
  if (Status s = MakeDirs(dir); !s.ok()) return s;
  std::string path = dir + "/synthetic-tokens-v" + std::to_string(vocab) + ".bin";
  if (std::filesystem::exists(path)) return path;
  auto lock = DatasetsLock::Take(dir);
  if (!lock.ok()) return lock.status();
  if (std::filesystem::exists(path)) return path;  // made while this process waited
  SyntheticTokensOptions o;
  o.vocab = vocab;
  if (Status s = MakeSyntheticTokens(path, o); !s.ok()) return s;  // whole or not at all
  return path;
}

}  // namespace fullburn
