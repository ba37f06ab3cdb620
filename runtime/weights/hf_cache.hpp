// Resolves a model argument: a folder, or a Hugging Face id ("org/name") found in the local HF
// cache ($HF_HOME/hub or ~/.cache/huggingface/hub, models--org--name/snapshots/<revision>/).
#pragma once

#include <filesystem>
#include <string>

namespace scr {

// Throws scr::Error listing where it looked when nothing is found.
std::filesystem::path resolve_model_path(const std::string& arg);

}  // namespace scr
