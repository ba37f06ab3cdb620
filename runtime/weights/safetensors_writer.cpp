#include "runtime/weights/safetensors_writer.hpp"

#include <fstream>
#include <nlohmann/json.hpp>

#include "runtime/core/error.hpp"

namespace scr {

void write_safetensors(const std::filesystem::path& path, const std::vector<TensorToWrite>& tensors,
                       const std::function<void(size_t, size_t)>& progress) {
    nlohmann::ordered_json header;
    header["__metadata__"] = {{"format", "pt"}};
    std::vector<uint64_t> sizes;
    uint64_t offset = 0;
    for (auto& t : tensors) {
        uint64_t n = uint64_t(dtype_bytes(t.dtype));
        for (auto d : t.shape) n *= uint64_t(d);
        offset = (offset + 63) / 64 * 64;
        header[t.name] = {{"dtype", std::string(dtype_safetensors_name(t.dtype))}, {"shape", t.shape},
                          {"data_offsets", {offset, offset + n}}};
        sizes.push_back(n);
        offset += n;
    }
    std::string text = header.dump();
    // Pad the header with spaces so the data section starts 64-byte aligned (as the format allows).
    while ((8 + text.size()) % 64 != 0) text += ' ';
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    if (!out) fail("cannot write {}", path.string());
    uint64_t n = text.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out.write(text.data(), std::streamsize(text.size()));
    uint64_t pos = 0;
    std::vector<std::byte> buf;
    for (size_t i = 0; i < tensors.size(); ++i) {
        uint64_t aligned = (pos + 63) / 64 * 64;
        static const char zeros[64] = {};
        out.write(zeros, std::streamsize(aligned - pos));
        buf.assign(sizes[i], std::byte{0});
        tensors[i].fill(buf.data(), buf.size());
        out.write(reinterpret_cast<const char*>(buf.data()), std::streamsize(buf.size()));
        pos = aligned + sizes[i];
        if (progress) progress(i + 1, tensors.size());
    }
    if (!out) fail("error writing {}", path.string());
}

}  // namespace scr
