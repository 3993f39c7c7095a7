// TensorBoard's event file: TFRecord framing (length, masked CRC-32C of
// the length, data, masked CRC-32C of the data; all little-endian) around
// tensorflow.Event messages, which are written here by hand: the handful of
// protobuf fields a scalar needs do not justify a protobuf dependency.
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>

#include "fullburn/trackers.h"

namespace fullburn {
namespace {

const uint32_t* Crc32cTable() {
  static uint32_t table[256];
  static bool made = [] {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;  // reflected Castagnoli
      table[i] = c;
    }
    return true;
  }();
  (void)made;
  return table;
}

void PutLittle(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void PutVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

// Protobuf wire types: 0 varint, 1 64-bit, 2 length-delimited, 5 32-bit.
void PutTag(std::string* out, int field, int wire_type) { PutVarint(out, (field << 3) | wire_type); }

void PutBytes(std::string* out, int field, const std::string& bytes) {
  PutTag(out, field, 2);
  PutVarint(out, bytes.size());
  out->append(bytes);
}

void PutDouble(std::string* out, int field, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  PutTag(out, field, 1);
  PutLittle(out, bits, 8);
}

void PutFloat(std::string* out, int field, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  PutTag(out, field, 5);
  PutLittle(out, bits, 4);
}

// tensorflow.Event: wall_time = 1, step = 2, file_version = 3, summary = 5.
std::string EventHeader(double wall_time, int64_t step) {
  std::string e;
  PutDouble(&e, 1, wall_time);
  if (step != 0) {
    PutTag(&e, 2, 0);
    PutVarint(&e, static_cast<uint64_t>(step));
  }
  return e;
}

std::string HostName() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') return "localhost";
  return host;
}

}  // namespace

uint32_t Crc32c(const void* data, size_t size, uint32_t crc) {
  const uint32_t* table = Crc32cTable();
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < size; ++i) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

uint32_t MaskedCrc32c(const void* data, size_t size) {
  uint32_t crc = Crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string TfRecord(const std::string& data) {
  std::string length;
  PutLittle(&length, data.size(), 8);
  std::string out = length;
  PutLittle(&out, MaskedCrc32c(length.data(), length.size()), 4);
  out += data;
  PutLittle(&out, MaskedCrc32c(data.data(), data.size()), 4);
  return out;
}

std::string ScalarEvent(double wall_time, int64_t step,
                        const std::vector<std::pair<std::string, float>>& values) {
  // Summary: repeated Value value = 1; Value: tag = 1, simple_value = 2.
  std::string summary;
  for (const auto& [tag, v] : values) {
    std::string value;
    PutBytes(&value, 1, tag);
    PutFloat(&value, 2, v);
    PutBytes(&summary, 1, value);
  }
  std::string e = EventHeader(wall_time, step);
  PutBytes(&e, 5, summary);
  return e;
}

Result<std::unique_ptr<TfEventsWriter>> TfEventsWriter::Open(const std::string& dir, double unix_time) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    return Status::IoError("cannot make the TensorBoard folder " + dir + ": " + ec.message() +
                           ": pass a folder this user can write");
  std::string path = dir + "/events.out.tfevents." + std::to_string(static_cast<int64_t>(unix_time)) + "." +
                     HostName() + "." + std::to_string(::getpid()) + ".fullburn";
  // A second writer in the same second (an export run twice) gets its own file.
  for (int i = 1; std::filesystem::exists(path, ec); ++i)
    path = path.substr(0, path.rfind(".fullburn")) + ".fullburn" + std::to_string(i);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f)
    return Status::IoError("cannot write the TensorBoard file " + path + ": " + std::strerror(errno) +
                           ": pass a folder this user can write");
  std::unique_ptr<TfEventsWriter> w(new TfEventsWriter(path, f));
  std::string first = EventHeader(unix_time, 0);
  PutBytes(&first, 3, "brain.Event:2");
  if (Status s = w->Append(TfRecord(first)); !s.ok()) return s;
  return w;
}

TfEventsWriter::~TfEventsWriter() {
  if (file_) std::fclose(file_);
}

Status TfEventsWriter::Append(const std::string& records) {
  if (!failed_.ok()) return failed_;
  if (std::fwrite(records.data(), 1, records.size(), file_) != records.size() || std::fflush(file_) != 0)
    failed_ = Status::IoError("cannot write the TensorBoard file " + path_ + ": " + std::strerror(errno) +
                              ": free space there or pass another folder; the run's store keeps "
                              "everything (fullburn runs export RUN --format tensorboard DIR)");
  return failed_;
}

Status TfEventsWriter::Write(const std::vector<TrackerPoint>& points) {
  std::map<std::pair<int64_t, double>, std::vector<std::pair<std::string, float>>> events;
  for (const TrackerPoint& p : points)
    events[{p.step, p.unix_time}].emplace_back(p.key, static_cast<float>(p.value));
  std::string records;
  for (const auto& [at, values] : events) records += TfRecord(ScalarEvent(at.second, at.first, values));
  if (records.empty()) return failed_;
  return Append(records);
}

}  // namespace fullburn
