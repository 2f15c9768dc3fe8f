// DeepSpeed's csv_monitor layout: one file per tag in the monitor's directory, named after the tag
// with '/' and ' ' replaced by '_' (Train/Samples/train_loss: Train_Samples_train_loss.csv),
// holding a header row "step,<the tag's last component>" and one "step,value" row per event.
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <string>

#include "strata/monitor/scalars.h"

namespace strata::monitor {

class CsvMonitor {
 public:
  // Creates dir (and its parents). Rows already in a tag's file with a step above keep_through
  // are dropped when this monitor first writes that tag (rewritten atomically): a resumed run
  // keeps the rows of the steps it resumed after and adds its own, one row per step, where
  // DeepSpeed would append duplicates. A fresh run passes keep_through 0 and starts each file
  // over. Files of tags this run never writes are left alone.
  CsvMonitor(const std::string& dir, int64_t keep_through);
  void write(int64_t step, const Scalars& values);
  const std::string& dir() const { return dir_; }
  // The file a tag goes to.
  std::string file_of(const std::string& tag) const;

 private:
  std::string dir_;
  int64_t keep_through_ = 0;
  // The files this monitor has trimmed and headed, open for appending.
  std::map<std::string, std::unique_ptr<std::ofstream>> files_;
  bool warned_ = false;
};

}  // namespace strata::monitor
