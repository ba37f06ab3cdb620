#include "runtime/weights/hf_cache.hpp"

#include <cstdlib>
#include <fstream>

#include "runtime/core/error.hpp"

namespace scr {

namespace fs = std::filesystem;

namespace {

fs::path hub_dir() {
    if (const char* h = std::getenv("HF_HUB_CACHE"); h && *h) return h;
    if (const char* h = std::getenv("HF_HOME"); h && *h) return fs::path(h) / "hub";
    if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return fs::path(x) / "huggingface" / "hub";
    const char* home = std::getenv("HOME");
    return fs::path(home ? home : "/") / ".cache" / "huggingface" / "hub";
}

}  // namespace

fs::path resolve_model_path(const std::string& arg) {
    if (arg.empty()) fail("no model given");
    fs::path p(arg);
    if (fs::is_directory(p)) return p;
    if (fs::is_regular_file(p) && p.filename() == "config.json") return p.parent_path().empty() ? "." : p.parent_path();
    // org/name -> models--org--name
    auto slash = arg.find('/');
    if (slash != std::string::npos && slash > 0 && arg.find('/', slash + 1) == std::string::npos && arg[0] != '.') {
        fs::path repo = hub_dir() / ("models--" + arg.substr(0, slash) + "--" + arg.substr(slash + 1));
        if (fs::is_directory(repo / "snapshots")) {
            std::string rev;
            std::ifstream ref(repo / "refs" / "main");
            if (ref) std::getline(ref, rev);
            if (!rev.empty() && fs::is_directory(repo / "snapshots" / rev)) return repo / "snapshots" / rev;
            for (auto& e : fs::directory_iterator(repo / "snapshots"))
                if (e.is_directory()) return e.path();
        }
        fail("model {} is neither a folder nor in the Hugging Face cache (looked in {})", arg, repo.string());
    }
    fail("model {}: no such folder", arg);
}

}  // namespace scr
