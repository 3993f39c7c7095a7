// A PyTorch profiler trace (Kineto JSON, or gzip of it: the reader goes by
// the magic bytes) through the whole of `fullburn analyze` for one rank:
// the block reader, the event scanner, the intervals and the findings.
#include "fullburn/analyze.h"
#include "fuzz_files.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string path = fuzz::WriteScratch("trace.json", data, size);
  fullburn::AnalyzeOptions options;
  fullburn::Result<fullburn::RankReport> report = fullburn::AnalyzeTraceFile(path, 0, options);
  if (report.ok()) (void)fullburn::RankFindings(*report);
  return 0;
}
