#include "runtime/model/device_open.hpp"

#include <map>
#include <mutex>
#include <string>

namespace scr {

namespace {

struct Registry {
    std::mutex mutex;
    std::map<std::string, DeviceOpener, std::less<>> openers;
};

Registry& registry() {
    static Registry r;  // function-local: safe to use from other static initializers
    return r;
}

DeviceOpener find(std::string_view target) {
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    auto it = r.openers.find(target);
    return it == r.openers.end() ? DeviceOpener{} : it->second;
}

}  // namespace

bool register_device_opener(std::string_view target, DeviceOpener opener) {
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    r.openers[std::string(target)] = opener;
    return true;
}

void start_device_open(std::string_view target) {
    if (auto o = find(target); o.start) o.start();
}

void finish_device_open(std::string_view target) {
    if (auto o = find(target); o.finish) o.finish();
}

}  // namespace scr
