// safetensors files without libtorch: the layout read back independently,
// checksums, damaged files, a failed write that leaves the old file, the
// background saver.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <zlib.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "fullburn/tensorfile.h"
#include "replay_env.h"

namespace fullburn {
namespace {

std::vector<uint8_t> Bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

TEST(TensorFile, TheLayoutIsSafetensorsWithAChecksum) {
  std::string dir = testing::FreshTestDir("fb_tensorfile");
  std::vector<float> a = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, 8.0f};
  std::vector<int64_t> b = {42, -1};
  std::string path = dir + "/x.safetensors";
  int64_t written = 0;
  ASSERT_TRUE(WriteTensorFile(path,
                              {{"a", "F32", {2, 3}, a.data(), a.size() * 4},
                               {"b", "I64", {2}, b.data(), b.size() * 8}},
                              {{"format", "test"}}, &written)
                  .ok());
  // Read here by the format's definition, not by ReadTensorFile.
  std::vector<uint8_t> file = Bytes(path);
  ASSERT_EQ(static_cast<int64_t>(file.size()), written);
  uint64_t n;
  std::memcpy(&n, file.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  auto header = nlohmann::json::parse(file.begin() + 8, file.begin() + 8 + static_cast<long>(n));
  const uint8_t* data = file.data() + 8 + n;
  size_t data_bytes = file.size() - 8 - n;
  EXPECT_EQ(header["a"]["dtype"], "F32");
  EXPECT_EQ(header["a"]["shape"], nlohmann::json({2, 3}));
  EXPECT_EQ(header["b"]["data_offsets"], nlohmann::json({24, 40}));
  EXPECT_EQ(std::memcmp(data, a.data(), 24), 0);
  EXPECT_EQ(std::memcmp(data + 24, b.data(), 16), 0);
  EXPECT_EQ(header["__metadata__"]["format"], "test");
  EXPECT_EQ(header["__metadata__"]["crc32"],
            std::to_string(crc32(crc32(0L, Z_NULL, 0), data, static_cast<uInt>(data_bytes))));

  Result<TensorFile> back = ReadTensorFile(path);
  ASSERT_TRUE(back.ok()) << back.status().message();
  ASSERT_EQ(back->tensors.size(), 2u);
  EXPECT_EQ(back->tensors[0].name, "a");
  EXPECT_EQ(std::memcmp(back->Data(back->tensors[1]), b.data(), 16), 0);
  EXPECT_EQ(back->metadata["format"], "test");
}

TEST(TensorFile, DamagedFilesAreRefusedWithTheirReason) {
  std::string dir = testing::FreshTestDir("fb_tensorfile");
  std::vector<float> a(1000, 1.0f);
  std::string path = dir + "/x.safetensors";
  ASSERT_TRUE(WriteTensorFile(path, {{"a", "F32", {1000}, a.data(), 4000}}, {}).ok());
  std::vector<uint8_t> good = Bytes(path);
  auto write = [&](const std::vector<uint8_t>& bytes) {
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                                static_cast<std::streamsize>(bytes.size()));
  };
  std::vector<uint8_t> flipped = good;
  flipped[flipped.size() - 5] ^= 0xff;
  write(flipped);
  EXPECT_NE(ReadTensorFile(path).status().message().find("checksum mismatch"), std::string::npos);
  write(std::vector<uint8_t>(good.begin(), good.begin() + static_cast<long>(good.size() / 2)));
  Status half = ReadTensorFile(path).status();
  EXPECT_EQ(half.code(), Status::Code::kCorruption);
  EXPECT_NE(half.message().find(path + " is unusable"), std::string::npos) << half.message();
  write({1, 2, 3});
  EXPECT_EQ(ReadTensorFile(path).status().code(), Status::Code::kCorruption);
  std::vector<uint8_t> junk(64, 'x');
  uint64_t hlen = 40;
  std::memcpy(junk.data(), &hlen, 8);
  write(junk);
  EXPECT_NE(ReadTensorFile(path).status().message().find("not safetensors JSON"), std::string::npos);
  EXPECT_EQ(ReadTensorFile(dir + "/none").status().code(), Status::Code::kNotFound);
}

// The metadata from the header alone: the same strings ReadTensorFile gives,
// while the data may be cut (it is not read); a cut header or junk is an error.
TEST(TensorFile, MetadataIsReadFromTheHeaderAlone) {
  std::string dir = testing::FreshTestDir("fb_tensorfile");
  std::vector<float> a(1000, 1.0f);
  std::string path = dir + "/x.safetensors";
  ASSERT_TRUE(WriteTensorFile(path, {{"a", "F32", {1000}, a.data(), 4000}},
                              {{"fullburn", R"({"step": 4})"}, {"format", "test"}})
                  .ok());
  auto meta = ReadTensorFileMetadata(path);
  ASSERT_TRUE(meta.ok()) << meta.status().message();
  EXPECT_EQ(*meta, ReadTensorFile(path)->metadata);
  EXPECT_EQ(meta->at("fullburn"), R"({"step": 4})");
  std::vector<uint8_t> good = Bytes(path);
  uint64_t hlen;
  std::memcpy(&hlen, good.data(), 8);
  auto write = [&](size_t n) {
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(good.data()),
                                                static_cast<std::streamsize>(n));
  };
  write(8 + hlen + 100);  // the data cut: the header still reads
  EXPECT_TRUE(ReadTensorFileMetadata(path).ok());
  write(8 + hlen / 2);
  EXPECT_EQ(ReadTensorFileMetadata(path).status().code(), Status::Code::kCorruption);
  write(5);
  EXPECT_EQ(ReadTensorFileMetadata(path).status().code(), Status::Code::kCorruption);
  EXPECT_EQ(ReadTensorFileMetadata(dir + "/none").status().code(), Status::Code::kNotFound);
}

TEST(TensorFile, AFailedWriteLeavesTheOldFileAndNoTemporary) {
  std::string dir = testing::FreshTestDir("fb_tensorfile");
  std::string path = dir + "/x.safetensors";
  std::vector<float> small(10, 1.0f), big(100000, 2.0f);
  ASSERT_TRUE(WriteTensorFile(path, {{"w", "F32", {10}, small.data(), 40}}, {}).ok());
  // RLIMIT_FSIZE stands in for a full disk (SIGXFSZ ignored: write fails with EFBIG).
  struct rlimit old;
  ::getrlimit(RLIMIT_FSIZE, &old);
  auto handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit tight = {4096, old.rlim_max};
  ::setrlimit(RLIMIT_FSIZE, &tight);
  Status s = WriteTensorFile(path, {{"w", "F32", {100000}, big.data(), 400000}}, {});
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, handler);
  EXPECT_EQ(s.code(), Status::Code::kIoError);
  EXPECT_NE(s.message().find("untouched"), std::string::npos) << s.message();
  Result<TensorFile> back = ReadTensorFile(path);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->tensors[0].size, 40u);
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    EXPECT_EQ(entry.path().filename().string().find(".tmp."), std::string::npos) << entry.path();
}

TEST(TensorFile, BadRecordsAreRefusedBeforeWriting) {
  std::string dir = testing::FreshTestDir("fb_tensorfile");
  float x[4] = {};
  EXPECT_EQ(WriteTensorFile(dir + "/a", {{"x", "F32", {3}, x, 16}}, {}).code(),
            Status::Code::kInvalidArgument);
  EXPECT_EQ(WriteTensorFile(dir + "/a", {{"x", "Q7", {4}, x, 16}}, {}).code(),
            Status::Code::kInvalidArgument);
  EXPECT_EQ(WriteTensorFile(dir + "/a", {{"x", "F32", {4}, x, 16}, {"x", "F32", {4}, x, 16}}, {}).code(),
            Status::Code::kInvalidArgument);
  EXPECT_FALSE(std::filesystem::exists(dir + "/a"));
}

TEST(TensorFile, TheSaverWritesStagedJobsInOrder) {
  std::string dir = testing::FreshTestDir("fb_tensorfile");
  TensorFileSaver saver;
  std::vector<std::shared_ptr<SaveJob>> jobs;
  for (int i = 0; i < 3; ++i) {
    auto job = saver.NewJob(dir + "/same.safetensors", {{"v", "I32", {1}, nullptr, 4}},
                            {{"i", std::to_string(i)}});
    ASSERT_TRUE(job.ok());
    int32_t value = i;
    std::memcpy((*job)->stage(0), &value, 4);
    saver.Start(*job);
    jobs.push_back(*job);
  }
  for (auto& job : jobs) EXPECT_TRUE(job->Wait().ok());
  EXPECT_TRUE(jobs.back()->done());
  EXPECT_EQ(jobs.back()->stage(0), nullptr);  // the staged memory went back once written
  Result<TensorFile> last = ReadTensorFile(dir + "/same.safetensors");
  ASSERT_TRUE(last.ok());
  EXPECT_EQ(last->metadata["i"], "2");
  int32_t v;
  std::memcpy(&v, last->Data(last->tensors[0]), 4);
  EXPECT_EQ(v, 2);
  auto failing = saver.NewJob(dir + "/no/such/dir/x", {{"v", "I32", {1}, nullptr, 4}}, {});
  ASSERT_TRUE(failing.ok());
  saver.Start(*failing);
  Status s = (*failing)->Wait();
  EXPECT_EQ(s.code(), Status::Code::kIoError);
  EXPECT_NE(s.message().find("no/such/dir"), std::string::npos);
}

// Streamed stores cover the aligned middle; the edges go through memcpy: every
// split of head, body and tail must land each byte, and touch none beyond.
TEST(TensorFile, CopyToStageCopiesEveryByteAtAnyAlignment) {
  std::vector<uint8_t> src(5000);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + 7);
  for (size_t bytes : {0, 1, 63, 255, 256, 257, 320, 1000, 4097}) {
    for (size_t dst_offset = 0; dst_offset < 17; ++dst_offset) {
      for (size_t src_offset : {0, 3, 16}) {
        std::vector<uint8_t> dst(bytes + 64, 0xEE);
        CopyToStage(dst.data() + dst_offset, src.data() + src_offset, bytes);
        for (size_t i = 0; i < dst_offset; ++i) ASSERT_EQ(dst[i], 0xEE) << "before, at " << i;
        ASSERT_EQ(0, std::memcmp(dst.data() + dst_offset, src.data() + src_offset, bytes))
            << bytes << " bytes to offset " << dst_offset << " from " << src_offset;
        for (size_t i = dst_offset + bytes; i < dst.size(); ++i)
          ASSERT_EQ(dst[i], 0xEE) << "after, at " << i;
      }
    }
  }
}

}  // namespace
}  // namespace fullburn
