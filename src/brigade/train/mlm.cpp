#include "brigade/train/mlm.h"

#include "brigade/core/error.h"

namespace brigade::train {

int train_bert_cli(const Recipe& r, const TrainOptions&) {
  BRIGADE_CHECK(false, ConfigError, "recipe {}: model.type = \"bert\" training is not built yet", r.path);
  return 1;
}
int eval_bert_cli(const std::string& ckpt_dir, int) {
  BRIGADE_CHECK(false, ConfigError, "--ckpt {}: bert evaluation is not built yet", ckpt_dir);
  return 1;
}

}  // namespace brigade::train
