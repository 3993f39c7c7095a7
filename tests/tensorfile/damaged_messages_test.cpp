// Every message about a damaged safetensors file that quotes a count or a
// name, checked against the file that produced it: the numbers and names in
// the message are the file's own (issue 53, "messages true to the input").
// The files are written here byte by byte, as another tool would, without
// WriteTensorFile.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <string>

#include "fullburn/tensorfile.h"
#include "replay_env.h"

namespace fullburn {
namespace {

class DamagedTensorFile : public ::testing::Test {
 protected:
  void SetUp() override { path_ = testing::FreshTestDir("fb_tensorfile_msg") + "/m.safetensors"; }
  // An 8-byte little-endian header length, the JSON header, then `data_bytes` bytes.
  std::string Message(const std::string& header, size_t data_bytes) {
    uint64_t n = header.size();
    std::ofstream out(path_, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << header << std::string(data_bytes, '\0');
    out.close();
    Result<TensorFile> read = ReadTensorFile(path_);
    EXPECT_FALSE(read.ok()) << header;
    return read.ok() ? "" : read.status().message();
  }
  std::string path_;
};

TEST_F(DamagedTensorFile, MessagesQuoteTheFilesOwnCountsAndNames) {
  // Sanity: the same writer makes a file that is read.
  {
    uint64_t n = 62;
    std::string header = R"({"w.bias":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";
    header.resize(n, ' ');
    std::ofstream out(path_, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << header << std::string(16, '\0');
  }
  ASSERT_TRUE(ReadTensorFile(path_).ok()) << ReadTensorFile(path_).status().message();

  EXPECT_NE(Message(R"({"__metadata__":{"data_bytes":"999"},"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 16)
                .find("16 bytes of data, the header says 999"),
            std::string::npos);
  EXPECT_NE(Message(R"({"w.bias":{"dtype":"F32","shape":[16],"data_offsets":[0,64]}})", 16)
                .find("tensor w.bias lies outside the file"),
            std::string::npos);
  EXPECT_NE(Message(R"({"layer.7":{"dtype":"Q7","shape":[16],"data_offsets":[0,16]}})", 16)
                .find("tensor layer.7 has dtype Q7"),
            std::string::npos);
  EXPECT_NE(Message(R"({"emb":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", 16)
                .find("tensor emb has the wrong size for its shape"),
            std::string::npos);
  EXPECT_NE(Message(R"({"head":{"dtype":"F32","shape":[4]}})", 16).find("tensor head has no dtype, shape or offsets"),
            std::string::npos);
  std::string message = Message(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 0);
  EXPECT_NE(message.find(path_), std::string::npos) << message;
  EXPECT_NE(message.find("tensor w lies outside the file"), std::string::npos) << message;
}

}  // namespace
}  // namespace fullburn
