#include "runtime/weights/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "runtime/core/error.hpp"

namespace scr {

namespace {
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the format's own limit
}

std::vector<TensorEntry> parse_safetensors_header(std::string_view json_text, uint64_t data_bytes,
                                                  const std::string& origin) {
    nlohmann::json header;
    try {
        header = nlohmann::json::parse(json_text);
    } catch (const nlohmann::json::exception& e) {
        fail("{}: safetensors header is not valid JSON ({})", origin, e.what());
    }
    if (!header.is_object()) fail("{}: safetensors header must be a JSON object", origin);
    std::vector<TensorEntry> out;
    for (auto& [name, v] : header.items()) {
        if (name == "__metadata__") continue;
        if (!v.is_object()) fail("{}: tensor {}: entry must be an object", origin, name);
        TensorEntry t;
        t.name = name;
        if (!v.contains("dtype") || !v["dtype"].is_string()) fail("{}: tensor {}: missing dtype", origin, name);
        auto dt = dtype_from_safetensors(v["dtype"].get<std::string>());
        if (!dt) fail("{}: tensor {}: unsupported dtype {}", origin, name, v["dtype"].get<std::string>());
        t.dtype = *dt;
        if (!v.contains("shape") || !v["shape"].is_array()) fail("{}: tensor {}: missing shape", origin, name);
        uint64_t elems = 1;
        for (auto& d : v["shape"]) {
            if (!d.is_number_unsigned() && !(d.is_number_integer() && d.get<int64_t>() >= 0))
                fail("{}: tensor {}: shape entries must be non-negative integers", origin, name);
            uint64_t n = d.get<uint64_t>();
            if (n != 0 && elems > std::numeric_limits<uint64_t>::max() / n)
                fail("{}: tensor {}: shape overflows", origin, name);
            elems *= n;
            t.shape.push_back(int64_t(n));
        }
        if (!v.contains("data_offsets") || !v["data_offsets"].is_array() || v["data_offsets"].size() != 2 ||
            !v["data_offsets"][0].is_number_unsigned() || !v["data_offsets"][1].is_number_unsigned())
            fail("{}: tensor {}: data_offsets must be two non-negative integers", origin, name);
        t.begin = v["data_offsets"][0].get<uint64_t>();
        t.end = v["data_offsets"][1].get<uint64_t>();
        if (t.begin > t.end) fail("{}: tensor {}: data_offsets [{}, {}] are reversed", origin, name, t.begin, t.end);
        if (t.end > data_bytes)
            fail("{}: tensor {}: data ends at byte {} but the file holds only {} data bytes (truncated file?)", origin,
                 name, t.end, data_bytes);
        uint64_t want = elems;
        if (want > std::numeric_limits<uint64_t>::max() / uint64_t(dtype_bytes(t.dtype)))
            fail("{}: tensor {}: size overflows", origin, name);
        want *= uint64_t(dtype_bytes(t.dtype));
        if (t.end - t.begin != want)
            fail("{}: tensor {}: {} data bytes for shape of {} bytes", origin, name, t.end - t.begin, want);
        out.push_back(std::move(t));
    }
    return out;
}

MappedFile::MappedFile(const std::filesystem::path& path) : path_(path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail("cannot open {}: {}", path.string(), std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        ::close(fd);
        fail("cannot stat {}: {}", path.string(), std::strerror(errno));
    }
    size_ = size_t(st.st_size);
    if (size_ > 0) {
        void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            ::close(fd);
            fail("cannot map {}: {}", path.string(), std::strerror(errno));
        }
        data_ = static_cast<const std::byte*>(p);
    }
    ::close(fd);
}

MappedFile::~MappedFile() {
    if (data_) ::munmap(const_cast<std::byte*>(data_), size_);
}

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::filesystem::path& path) {
    auto f = std::unique_ptr<SafetensorsFile>(new SafetensorsFile());
    f->file_ = std::make_unique<MappedFile>(path);
    const std::string origin = path.string();
    const size_t size = f->file_->size();
    if (size < 8) fail("{}: too short to be a safetensors file ({} bytes; truncated?)", origin, size);
    uint64_t n = 0;
    std::memcpy(&n, f->file_->data(), 8);  // little-endian on every target we build for
    if (n > kMaxHeaderBytes) fail("{}: safetensors header length {} is over the 100 MiB limit (corrupt file?)", origin, n);
    if (n > size - 8) fail("{}: header of {} bytes runs past the end of the {}-byte file (truncated?)", origin, n, size);
    std::string_view text(reinterpret_cast<const char*>(f->file_->data() + 8), n);
    f->data_start_ = f->file_->data() + 8 + n;
    f->tensors_ = parse_safetensors_header(text, size - 8 - n, origin);
    return f;
}

}  // namespace scr
