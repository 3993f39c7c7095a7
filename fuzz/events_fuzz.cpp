// The step-event lines a job appends to $FULLBURN_EVENTS: each line alone,
// then the whole input through the file reader that `fullburn run` polls.
#include <sstream>

#include "fullburn/store.h"
#include "fuzz_files.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) (void)fullburn::ParseEventLine(line, 1000.0);
  std::string path = fuzz::WriteScratch("events.jsonl", data, size);
  fullburn::EventFileReader reader(path);
  std::vector<fullburn::StepRecord> steps;
  std::vector<fullburn::RunEvent> events;
  (void)reader.Poll(1000.0, &steps, &events);
  return 0;
}
