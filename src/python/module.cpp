// fullburn._native: the loaders and the tensor-file saver for Python
// (src/internal/fullburn/python.h has the contract; python/fullburn/ the API).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <pybind11/numpy.h>

#include <cstdlib>
#include <cstring>
#include <new>
#include <thread>
#include <tuple>

#include "fullburn/env.h"
#include "fullburn/pipeline.h"
#include "fullburn/python.h"
#include "fullburn/tensorfile.h"

namespace py = pybind11;

namespace fullburn {

uint8_t* BatchMemory::Take(size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(bytes);
    if (it != free_.end()) {
      uint8_t* block = it->second;
      free_.erase(it);
      return block;
    }
  }
  size_t rounded = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
  auto* block = static_cast<uint8_t*>(std::aligned_alloc(64, rounded));
  if (!block) return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  all_.push_back({block, bytes, false});
  return block;
}

void BatchMemory::Give(uint8_t* block, size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  free_.emplace(bytes, block);
}

std::vector<uintptr_t> BatchMemory::Blocks() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<uintptr_t> out;
  for (const Block& b : all_) out.push_back(reinterpret_cast<uintptr_t>(b.data));
  return out;
}

void BatchMemory::SetDeviceHooks(BlockHook register_block, BlockHook unregister_block) {
  std::lock_guard<std::mutex> lock(mu_);
  register_ = std::move(register_block);
  unregister_ = std::move(unregister_block);
}

bool BatchMemory::RegisterBlock(uintptr_t block) {
  BlockHook hook;
  size_t at = 0, bytes = 0;  // an index: other threads may grow all_ meanwhile
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!register_) return false;
    while (at < all_.size() && reinterpret_cast<uintptr_t>(all_[at].data) != block) ++at;
    if (at == all_.size()) return false;
    if (all_[at].registered) return true;
    all_[at].registered = true;
    bytes = all_[at].bytes;
    hook = register_;
  }
  // Outside the lock: the hook waits for the GIL, which a thread giving a
  // block back may hold while it waits for the lock.
  try {
    hook(block, bytes);
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    all_[at].registered = false;
    throw;
  }
  return true;
}

size_t BatchMemory::RegisteredBlocks() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const Block& b : all_) n += b.registered;
  return n;
}

BatchMemory::~BatchMemory() {
  for (const Block& b : all_) {
    // Unregistered first: a registration left on freed memory makes the
    // next block there fail to register ("already mapped").
    if (b.registered && unregister_) unregister_(reinterpret_cast<uintptr_t>(b.data), b.bytes);
    std::free(b.data);
  }
}

namespace {

PyObject* g_data_error = nullptr;  // fullburn.DataError, made at import

// The Python exception for a Status: one line, the kind by its code.
[[noreturn]] void Raise(const Status& s, bool data = false) {
  PyObject* type = PyExc_RuntimeError;
  switch (s.code()) {
    case Status::Code::kInvalidArgument: type = PyExc_ValueError; break;
    case Status::Code::kNotFound: type = data ? g_data_error : PyExc_FileNotFoundError; break;
    case Status::Code::kIoError: type = PyExc_OSError; break;
    case Status::Code::kResourceExhausted: type = PyExc_MemoryError; break;
    case Status::Code::kCorruption: type = g_data_error; break;
    default: type = data ? g_data_error : PyExc_RuntimeError; break;
  }
  PyErr_SetString(type, FirstLine(s.message()).c_str());
  throw py::error_already_set();
}

bool Finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

// A Python callable as a BatchMemory hook, called with the GIL. One that
// unregisters (`quiet`) never throws: it runs while memory is freed, and does
// nothing once the interpreter is finalizing (the process is ending).
BatchMemory::BlockHook PythonHook(py::function fn, bool quiet) {
  std::shared_ptr<py::function> held(new py::function(std::move(fn)), [](py::function* f) {
    if (Py_IsInitialized() && !Finalizing()) {
      py::gil_scoped_acquire gil;
      delete f;
    } else {
      f->release();  // no GIL to be had: the reference goes with the process
      delete f;
    }
  });
  return [held, quiet](uintptr_t block, size_t bytes) {
    if (quiet && (!Py_IsInitialized() || Finalizing())) return;
    py::gil_scoped_acquire gil;
    if (!quiet) {
      (*held)(block, bytes);
      return;
    }
    try {
      (*held)(block, bytes);
    } catch (py::error_already_set&) {
    }
  };
}

// A block handed to an array: back to its pool when the array goes.
struct Held {
  std::shared_ptr<BatchMemory> pool;
  uint8_t* block;
  size_t bytes;
};

// A C-ordered array of T, its strides given: pybind11 before 2.12 (Debian's
// is 2.10) works out default strides from the dtype's item size, which it
// reads at numpy 1's offset in the descriptor; numpy 2 moved that field, so
// under numpy 2 every label read as the first one. Given strides are used
// as they are. Without `data` numpy allocates the array.
template <typename T>
py::array NewArray(const std::vector<py::ssize_t>& shape, const void* data = nullptr,
                   py::handle base = py::handle()) {
  std::vector<py::ssize_t> strides(shape.size());
  py::ssize_t step = sizeof(T);
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = step;
    step *= shape[i];
  }
  return py::array(py::dtype::of<T>(), shape, strides, data, base);
}

py::capsule Owner(const std::shared_ptr<BatchMemory>& pool, uint8_t* block, size_t bytes) {
  return py::capsule(new Held{pool, block, bytes}, [](void* p) {
    auto* held = static_cast<Held*>(p);
    held->pool->Give(held->block, held->bytes);
    delete held;
  });
}

py::dict StatsDict(const LoaderStats& s) {
  py::dict d;
  d["batches"] = s.batches;
  d["samples"] = s.samples;
  d["skipped"] = s.skipped;
  d["cache_hits"] = s.cache_hits;
  d["cache_bytes"] = s.cache_bytes;
  d["read_s"] = s.stages.read_s;
  d["decode_s"] = s.stages.decode_s;
  d["augment_s"] = s.stages.augment_s;
  d["wait_s"] = s.consumer_wait_s;
  d["threads"] = s.threads;
  d["prefetch"] = s.prefetch;
  d["ready_batches"] = s.ready_batches;
  return d;
}

// ImageLoader with its batches handed to NumPy: see python/fullburn/_loaders.py.
class NativeImageLoader {
 public:
  NativeImageLoader(const std::string& root, int batch_size, bool train, int crop, int threads,
                    int prefetch, uint64_t seed, bool shuffle, bool keep_last, int rank,
                    int world_size, bool fail_on_bad_sample, bool normalize,
                    std::vector<float> mean, std::vector<float> std, bool channels_last,
                    int64_t cache_bytes, int resize, int cpu_budget)
      : pool_(std::make_shared<BatchMemory>()) {
    if (batch_size < 1) Raise(Status::InvalidArgument("batch_size must be at least 1, not " + std::to_string(batch_size)));
    if (crop < 1) Raise(Status::InvalidArgument("crop must be at least 1 pixel, not " + std::to_string(crop)));
    if (world_size < 1 || rank < 0 || rank >= world_size)
      Raise(Status::InvalidArgument("rank " + std::to_string(rank) + " is not one of world_size " +
                                    std::to_string(world_size) + "'s ranks"));
    if (mean.size() != 3 || std.size() != 3)
      Raise(Status::InvalidArgument("mean and std need one value per RGB channel (3 each)"));
    for (float v : std)
      if (!(v > 0)) Raise(Status::InvalidArgument("std must be positive"));
    LoaderOptions o;
    o.root = root;
    o.batch_size = batch_size;
    o.train = train;
    o.out_w = o.out_h = crop;
    o.eval_resize = resize > 0 ? resize : crop * 256 / 224;  // torchvision's 256 for 224
    o.threads = threads;
    o.cpu_budget = cpu_budget;
    o.prefetch = prefetch;
    o.seed = seed;
    o.shuffle = shuffle;
    o.keep_last = keep_last;
    o.rank = rank;
    o.world_size = world_size;
    o.on_bad_sample = fail_on_bad_sample ? BadSamplePolicy::kFail : BadSamplePolicy::kSkip;
    o.bad_sample_fix = "on_bad_sample=\"skip\" goes on without it";
    o.normalize.enabled = normalize;
    for (int c = 0; c < 3; ++c) o.normalize.mean[c] = mean[static_cast<size_t>(c)];
    for (int c = 0; c < 3; ++c) o.normalize.std[c] = std[static_cast<size_t>(c)];
    o.layout = channels_last ? Layout::kNHWC : Layout::kNCHW;
    o.cache_bytes = cache_bytes;
    std::shared_ptr<BatchMemory> pool = pool_;
    o.allocate_images = [pool](size_t bytes) { return pool->Take(bytes); };
    Result<std::unique_ptr<ImageLoader>> loader = Status::Internal("not opened");
    {
      py::gil_scoped_release release;  // scanning a large folder takes a while
      loader = ImageLoader::Open(o);
    }
    if (!loader.ok()) Raise(loader.status(), /*data=*/true);
    loader_ = std::move(*loader);
    value_bytes_ = normalize ? sizeof(float) : 1;
    image_bytes_ = static_cast<size_t>(crop) * crop * 3 * value_bytes_;
    crop_ = crop;
    channels_last_ = channels_last;
  }

  int64_t dataset_size() const { return loader_->dataset_size(); }
  int64_t epoch_size() const { return loader_->epoch_size(); }
  int64_t batches_per_epoch() const { return loader_->batches_per_epoch(); }
  std::vector<std::string> classes() const { return loader_->folder().classes; }

  void StartEpoch(int epoch, int64_t first_batch, int64_t consumed_samples) {
    py::gil_scoped_release release;  // waits for samples still in flight
    loader_->StartEpoch(epoch, first_batch, consumed_samples);
  }

  py::tuple Position() const {
    LoaderPosition p = loader_->position();
    return py::make_tuple(p.epoch, p.next_batch);
  }

  // (images, labels, batch index, dataset indices) or None at the epoch's end.
  py::object Next() {
    Batch b;
    bool got;
    {
      py::gil_scoped_release release;
      got = loader_->Next(&b);
    }
    if (!got) {
      if (Status s = loader_->status(); !s.ok()) Raise(s, /*data=*/true);
      return py::none();
    }
    uint8_t* block = const_cast<uint8_t*>(b.images);
    size_t block_bytes = image_bytes_ * static_cast<size_t>(loader_->options().batch_size);
    loader_->ring().HandOverMemory(b);
    py::array labels = NewArray<int64_t>({b.size});
    py::array samples = NewArray<int64_t>({b.size});
    auto* out = static_cast<int64_t*>(labels.mutable_data());
    auto* which = static_cast<int64_t*>(samples.mutable_data());
    for (int i = 0; i < b.size; ++i) out[i] = b.labels[i], which[i] = b.samples[i];
    loader_->Release(b);
    py::dtype dtype = value_bytes_ == 1 ? py::dtype::of<uint8_t>() : py::dtype::of<float>();
    const py::ssize_t n = b.size, s = crop_, v = static_cast<py::ssize_t>(value_bytes_);
    std::vector<py::ssize_t> shape = channels_last_ ? std::vector<py::ssize_t>{n, s, s, 3}
                                                    : std::vector<py::ssize_t>{n, 3, s, s};
    std::vector<py::ssize_t> strides =
        channels_last_ ? std::vector<py::ssize_t>{s * s * 3 * v, s * 3 * v, 3 * v, v}
                       : std::vector<py::ssize_t>{3 * s * s * v, s * s * v, s * v, v};
    py::array images(dtype, shape, strides, block, Owner(pool_, block, block_bytes));
    return py::make_tuple(images, labels, b.index, samples);
  }

  py::dict Stats() const { return StatsDict(loader_->stats()); }
  std::vector<uintptr_t> MemoryBlocks() const { return pool_->Blocks(); }
  void SetDeviceHooks(py::function register_block, py::function unregister_block) {
    pool_->SetDeviceHooks(PythonHook(std::move(register_block), false),
                          PythonHook(std::move(unregister_block), true));
  }
  bool RegisterBlock(uintptr_t block) { return pool_->RegisterBlock(block); }
  size_t RegisteredBlocks() const { return pool_->RegisteredBlocks(); }

 private:
  std::shared_ptr<BatchMemory> pool_;
  std::unique_ptr<ImageLoader> loader_;  // after pool_: goes first
  size_t value_bytes_ = 1, image_bytes_ = 0;
  int crop_ = 0;
  bool channels_last_ = false;
};

// Token windows (nanoGPT's and llm.c's files) as int64 arrays.
class NativeTokenLoader {
 public:
  NativeTokenLoader(std::vector<std::string> paths, int batch_size, int seq_len, uint64_t seed)
      : pool_(std::make_shared<BatchMemory>()), batch_size_(batch_size), seed_(seed) {
    if (batch_size < 1) Raise(Status::InvalidArgument("batch_size must be at least 1"));
    Result<std::unique_ptr<TokenShards>> shards = TokenShards::Open(paths, seq_len);
    if (!shards.ok()) Raise(shards.status(), /*data=*/true);
    shards_ = std::move(*shards);
  }

  int64_t tokens() const { return shards_->tokens(); }

  // Batch `index` of the whole job (every rank's): x, y as int64 [batch, seq_len].
  py::tuple Batch(int64_t index) {
    const int b = batch_size_, t = shards_->seq_len();
    const size_t values = static_cast<size_t>(b) * static_cast<size_t>(t);
    uint8_t* xb = pool_->Take(values * sizeof(int64_t));
    uint8_t* yb = pool_->Take(values * sizeof(int64_t));
    if (!xb || !yb) Raise(Status::ResourceExhausted("no memory for a token batch"));
    {
      py::gil_scoped_release release;
      thread_local std::vector<int32_t> x32, y32;
      x32.resize(values);
      y32.resize(values);
      shards_->Batch(seed_, index, b, x32.data(), y32.data());
      auto* x = reinterpret_cast<int64_t*>(xb);
      auto* y = reinterpret_cast<int64_t*>(yb);
      for (size_t i = 0; i < values; ++i) x[i] = x32[i], y[i] = y32[i];
    }
    std::vector<py::ssize_t> shape{b, t};
    py::array x = NewArray<int64_t>(shape, xb, Owner(pool_, xb, values * 8));
    py::array y = NewArray<int64_t>(shape, yb, Owner(pool_, yb, values * 8));
    return py::make_tuple(x, y);
  }

 private:
  std::shared_ptr<BatchMemory> pool_;
  std::unique_ptr<TokenShards> shards_;
  int batch_size_;
  uint64_t seed_;
};

TensorFileSaver& Saver() {
  static TensorFileSaver* saver = new TensorFileSaver();  // drained at exit by the package
  return *saver;
}

// save_async's staging: python/fullburn/_checkpoint.py fills stage(i) with
// tensor i's bytes, then start()s the write on the saver's thread.
class NativeSave {
 public:
  NativeSave(const std::string& path, const py::list& records, const py::dict& metadata) {
    std::vector<TensorRecord> list;
    for (const py::handle& r : records) {
      auto t = r.cast<py::tuple>();
      TensorRecord rec;
      rec.name = t[0].cast<std::string>();
      rec.dtype = t[1].cast<std::string>();
      rec.shape = t[2].cast<std::vector<int64_t>>();
      rec.bytes = t[3].cast<uint64_t>();
      list.push_back(std::move(rec));
    }
    std::map<std::string, std::string> meta;
    for (const auto& [k, v] : metadata) meta[k.cast<std::string>()] = v.cast<std::string>();
    Result<std::shared_ptr<SaveJob>> job = Saver().NewJob(path, std::move(list), std::move(meta));
    if (!job.ok()) Raise(job.status());
    job_ = *job;
  }

  size_t count() const { return job_->count(); }
  py::memoryview Stage(size_t i) {
    if (i >= job_->count() || !job_->stage(i)) Raise(Status::InvalidArgument("no stage buffer " + std::to_string(i)));
    return py::memoryview::from_memory(job_->stage(i), static_cast<py::ssize_t>(job_->record(i).bytes),
                                       /*readonly=*/false);
  }
  uintptr_t StageAddress(size_t i) { return reinterpret_cast<uintptr_t>(job_->stage(i)); }
  // Copies host memory into the stages without the GIL, on two threads (a
  // state dict's copy is the time the training loop is blocked): each item
  // is (stage index, source address, bytes), the source contiguous host
  // memory the caller keeps alive for the call.
  void CopyFrom(const std::vector<std::tuple<size_t, uintptr_t, uint64_t>>& items) {
    for (const auto& [i, src, bytes] : items)
      if (i >= job_->count() || !job_->stage(i) || bytes != job_->record(i).bytes)
        Raise(Status::InvalidArgument("copy into stage " + std::to_string(i) + ": wrong size"));
    py::gil_scoped_release release;
    uint64_t total = 0;
    for (const auto& item : items) total += std::get<2>(item);
    // Two halves of the bytes, cut at a tensor's edge.
    size_t cut = 0;
    for (uint64_t seen = 0; cut < items.size() && seen < total / 2; ++cut) seen += std::get<2>(items[cut]);
    auto copy = [&](size_t begin, size_t end) {
      for (size_t k = begin; k < end; ++k) {
        const auto& [i, src, bytes] = items[k];
        CopyToStage(job_->stage(i), reinterpret_cast<const void*>(src), bytes);
      }
    };
    std::thread other(copy, cut, items.size());
    copy(0, cut);
    other.join();
  }
  void Start() { Saver().Start(job_); }
  bool Done() const { return job_->done(); }
  void Wait() const {
    Status s;
    {
      py::gil_scoped_release release;
      s = job_->Wait();
    }
    if (!s.ok()) Raise(s);
  }
  const std::string& path() const { return job_->path(); }

 private:
  std::shared_ptr<SaveJob> job_;
};

// A verified file: (bytes as a uint8 array, [(name, dtype, shape, offset, size)], metadata).
py::tuple ReadTensors(const std::string& path) {
  Result<TensorFile> file = Status::Internal("not read");
  {
    py::gil_scoped_release release;
    file = ReadTensorFile(path);
  }
  if (!file.ok()) Raise(file.status());
  auto* held = new TensorFile(std::move(*file));
  py::capsule owner(held, [](void* p) { delete static_cast<TensorFile*>(p); });
  py::array bytes = NewArray<uint8_t>({static_cast<py::ssize_t>(held->bytes.size())},
                                     held->bytes.data(), owner);
  py::list entries;
  for (const TensorFileEntry& e : held->tensors)
    entries.append(py::make_tuple(e.name, e.dtype, e.shape, held->data_start + e.offset, e.size));
  py::dict meta;
  for (const auto& [k, v] : held->metadata) meta[py::str(k)] = v;
  return py::make_tuple(bytes, entries, meta);
}

}  // namespace
}  // namespace fullburn

PYBIND11_MODULE(_native, m) {
  using namespace fullburn;
  m.doc() = "fullburn's native half: loaders and the tensor-file saver (use the fullburn package)";
  // The package checks this against its own _version.py: a module left from
  // another build beside newer .py files fails in one line, not in a call.
  m.attr("__version__") = FULLBURN_VERSION;
  g_data_error = PyErr_NewExceptionWithDoc(
      "fullburn.DataError",
      "The data cannot be read: a bad sample under on_bad_sample='fail', an empty or "
      "unreadable dataset, a damaged file.",
      PyExc_RuntimeError, nullptr);
  m.attr("DataError") = py::handle(g_data_error);

  py::class_<NativeImageLoader>(m, "ImageLoader")
      .def(py::init<const std::string&, int, bool, int, int, int, uint64_t, bool, bool, int, int,
                    bool, bool, std::vector<float>, std::vector<float>, bool, int64_t, int, int>(),
           py::arg("root"), py::arg("batch_size"), py::arg("train"), py::arg("crop"),
           py::arg("threads"), py::arg("prefetch"), py::arg("seed"), py::arg("shuffle"),
           py::arg("keep_last"), py::arg("rank"), py::arg("world_size"),
           py::arg("fail_on_bad_sample"), py::arg("normalize"), py::arg("mean"), py::arg("std"),
           py::arg("channels_last"), py::arg("cache_bytes"), py::arg("resize"),
           py::arg("cpu_budget"))
      .def_property_readonly("dataset_size", &NativeImageLoader::dataset_size)
      .def_property_readonly("epoch_size", &NativeImageLoader::epoch_size)
      .def_property_readonly("batches_per_epoch", &NativeImageLoader::batches_per_epoch)
      .def_property_readonly("classes", &NativeImageLoader::classes)
      .def("start_epoch", &NativeImageLoader::StartEpoch)
      .def("position", &NativeImageLoader::Position)
      .def("next", &NativeImageLoader::Next)
      .def("stats", &NativeImageLoader::Stats)
      .def("memory_blocks", &NativeImageLoader::MemoryBlocks)
      .def("set_device_hooks", &NativeImageLoader::SetDeviceHooks)
      .def("register_block", &NativeImageLoader::RegisterBlock)
      .def("registered_blocks", &NativeImageLoader::RegisteredBlocks);

  py::class_<NativeTokenLoader>(m, "TokenLoader")
      .def(py::init<std::vector<std::string>, int, int, uint64_t>(), py::arg("paths"),
           py::arg("batch_size"), py::arg("seq_len"), py::arg("seed"))
      .def_property_readonly("tokens", &NativeTokenLoader::tokens)
      .def("batch", &NativeTokenLoader::Batch);

  py::class_<NativeSave>(m, "Save")
      .def(py::init<const std::string&, const py::list&, const py::dict&>())
      .def("__len__", &NativeSave::count)
      .def("stage", &NativeSave::Stage)
      .def("stage_address", &NativeSave::StageAddress)
      .def("copy_from", &NativeSave::CopyFrom)
      .def("start", &NativeSave::Start)
      .def("done", &NativeSave::Done)
      .def("wait", &NativeSave::Wait)
      .def_property_readonly("path", &NativeSave::path);

  m.def("read_tensor_file", &ReadTensors, py::arg("path"));
  m.def("drain", [] {
    py::gil_scoped_release release;
    Saver().Drain();
  });
  m.def("cpus", [] { return RankCpus(ReadCpuView(Env::Default()), 1); },
        "The CPUs this process may use (affinity, container quota)");
}
