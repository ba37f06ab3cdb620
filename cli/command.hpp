// Each `scr` subcommand lives in its own cli/cmd_*.cpp and registers itself here, so adding a
// command touches no other file.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <vector>

namespace scr::cli {

using CommandSetup = void (*)(CLI::App& root);

std::vector<CommandSetup>& command_setups();

struct CommandRegistrar {
    explicit CommandRegistrar(CommandSetup setup) { command_setups().push_back(setup); }
};

// Set by a command's callback; main returns it.
int& exit_code();

}  // namespace scr::cli
