// Contrastive image-caption training for model.type = "clip" (issue 8). Work in progress.
#pragma once
#include <string>

#include "brigade/train/config.h"
#include "brigade/train/trainer.h"

namespace brigade::train {

// `brigade train` for model.type = "clip": trains, prints the final line, returns the exit code.
int train_clip_cli(const Recipe& r, const TrainOptions& opts);
// `brigade eval --ckpt DIR` for a clip checkpoint: prints the result, returns the exit code.
int eval_clip_cli(const std::string& ckpt_dir, int threads);

}  // namespace brigade::train
