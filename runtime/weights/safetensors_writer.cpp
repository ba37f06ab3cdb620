#include "runtime/weights/safetensors_writer.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "runtime/core/error.hpp"

namespace scr {

namespace {

struct FileCloser {
    int fd;
    ~FileCloser() {
        if (fd >= 0) ::close(fd);
    }
};

}  // namespace

void write_safetensors(const std::filesystem::path& path, const std::vector<TensorToWrite>& tensors,
                       const std::function<void(size_t, size_t)>& progress) {
    nlohmann::ordered_json header;
    header["__metadata__"] = {{"format", "pt"}};
    std::vector<uint64_t> offsets, sizes;
    uint64_t offset = 0;
    for (auto& t : tensors) {
        uint64_t n = uint64_t(dtype_bytes(t.dtype));
        for (auto d : t.shape) n *= uint64_t(d);
        offset = (offset + 63) / 64 * 64;
        header[t.name] = {{"dtype", std::string(dtype_safetensors_name(t.dtype))}, {"shape", t.shape},
                          {"data_offsets", {offset, offset + n}}};
        offsets.push_back(offset);
        sizes.push_back(n);
        offset += n;
    }
    std::string text = header.dump();
    // Pad the header with spaces so the data section starts 64-byte aligned (as the format allows).
    while ((8 + text.size()) % 64 != 0) text += ' ';
    const uint64_t data_start = 8 + text.size();
    const uint64_t file_bytes = data_start + offset;

    // The data is filled in place through a shared mapping of the file: no staging buffer and no
    // serial write() of tens of GB (the fills themselves are parallel). The space is checked first,
    // because a full file system would otherwise show up as SIGBUS on a page of the mapping.
    const auto dir = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
    std::error_code ec;
    const uint64_t replaced = std::filesystem::is_regular_file(path, ec) ? std::filesystem::file_size(path, ec) : 0;
    if (struct statvfs fs{}; ::statvfs(dir.c_str(), &fs) == 0 && uint64_t(fs.f_bavail) * fs.f_frsize + replaced < file_bytes)
        fail("cannot write {}: it needs {:.2f} GB, {} has {:.2f} GB free", path.string(), file_bytes / 1e9, dir.string(),
             double(uint64_t(fs.f_bavail) * fs.f_frsize + replaced) / 1e9);
    FileCloser file{::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)};
    if (file.fd < 0) fail("cannot write {}: {}", path.string(), std::strerror(errno));
    if (::ftruncate(file.fd, off_t(file_bytes)) != 0) fail("cannot size {}: {}", path.string(), std::strerror(errno));
    void* map = ::mmap(nullptr, file_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, file.fd, 0);
    if (map == MAP_FAILED) fail("cannot map {} for writing: {}", path.string(), std::strerror(errno));
    auto* base = static_cast<std::byte*>(map);
    const uint64_t n = text.size();
    std::memcpy(base, &n, 8);
    std::memcpy(base + 8, text.data(), text.size());
    try {
        for (size_t i = 0; i < tensors.size(); ++i) {
            tensors[i].fill(base + data_start + offsets[i], sizes[i]);  // the pages start zeroed
            if (progress) progress(i + 1, tensors.size());
        }
    } catch (...) {
        ::munmap(map, file_bytes);
        throw;
    }
    if (::munmap(map, file_bytes) != 0) fail("error writing {}: {}", path.string(), std::strerror(errno));
}

}  // namespace scr
