// Opening an accelerator takes long (a CUDA context: ~0.3-0.4 s on the H200) and needs nothing from
// the model's files. A target registers a function that starts opening its device on a background
// thread and one that waits for it; load_model starts it as soon as it knows the target, so the
// device opens while config.json is checked and the weights are mapped and validated, and makes
// sure it has ended before load_model returns or throws (a process must not exit while a driver is
// half initialized).
#pragma once

#include <string_view>

namespace scr {

struct DeviceOpener {
    void (*start)() = nullptr;  // begins opening the device in the background; called at most once per load
    void (*finish)() = nullptr; // waits until the opening has ended (successfully or not); idempotent
};

// Called from a static initializer of the target's runtime library.
bool register_device_opener(std::string_view target, DeviceOpener opener);

// What load_model uses: start (no-op for targets without an opener), and a guard that finishes.
void start_device_open(std::string_view target);
void finish_device_open(std::string_view target);

class DeviceOpenGuard {
public:
    explicit DeviceOpenGuard(std::string_view target) : target_(target) { start_device_open(target_); }
    ~DeviceOpenGuard() { finish_device_open(target_); }
    DeviceOpenGuard(const DeviceOpenGuard&) = delete;
    DeviceOpenGuard& operator=(const DeviceOpenGuard&) = delete;

private:
    std::string_view target_;
};

}  // namespace scr
