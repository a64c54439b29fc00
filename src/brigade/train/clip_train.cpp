#include "brigade/train/clip_train.h"

#include "brigade/core/error.h"

namespace brigade::train {

int train_clip_cli(const Recipe& r, const TrainOptions&) {
  BRIGADE_CHECK(false, ConfigError, "recipe {}: model.type = \"clip\" training is not built yet", r.path);
  return 1;
}
int eval_clip_cli(const std::string& ckpt_dir, int) {
  BRIGADE_CHECK(false, ConfigError, "--ckpt {}: clip evaluation is not built yet", ckpt_dir);
  return 1;
}

}  // namespace brigade::train
