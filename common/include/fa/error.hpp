/// \file error.hpp
/// \brief The two kinds of failure every executable distinguishes.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace fa {

/// Bad input from the user: an option out of range, a malformed .npy file, a problem too
/// large for this machine, a head dimension a stage does not support. Executables catch it,
/// print its message and exit with code 2.
class InputError : public std::runtime_error {
public:
    /// \param message names what is wrong and what is allowed.
    explicit InputError(const std::string& message) : std::runtime_error(message) {}
};

/// Throws InputError unless a count option is at least 1: "--heads is 0: it must be at least 1".
inline void require_positive(const char* option, int64_t value) {
    if (value < 1) throw InputError(std::string(option) + " is " + std::to_string(value) + ": it must be at least 1");
}

/// Exit codes shared by every stage executable.
enum ExitCode : int {
    kExitPass = 0,       ///< every comparison within tolerance
    kExitMismatch = 1,   ///< a comparison failed
    kExitBadInput = 2,   ///< the input was refused with a message
    kExitSkipped = 77,   ///< the stage needs hardware this machine lacks (CTest's skip code)
};

}  // namespace fa
