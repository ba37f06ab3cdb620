// scr: the specialized engine and server. Subcommands register themselves (cli/command.hpp).
#include <fmt/format.h>

#include <cstdio>
#include <exception>

#include "cli/command.hpp"
#include "runtime/core/error.hpp"

namespace scr::cli {

std::vector<CommandSetup>& command_setups() {
    static std::vector<CommandSetup> setups;
    return setups;
}

int& exit_code() {
    static int code = 0;
    return code;
}

}  // namespace scr::cli

int main(int argc, char** argv) {
    CLI::App app{"scr: a Scratchy engine specialized at build time for the models listed by `scr models`"};
    app.require_subcommand(1);
    app.set_version_flag("--version", "scr " SCR_VERSION);
    for (auto setup : scr::cli::command_setups()) setup(app);
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e);
    } catch (const scr::Error& e) {
        std::fflush(stdout);
        fmt::print(stderr, "error: {}\n", e.what());
        return 1;
    } catch (const std::exception& e) {
        std::fflush(stdout);
        fmt::print(stderr, "error: {}\n", e.what());
        return 1;
    }
    return scr::cli::exit_code();
}
