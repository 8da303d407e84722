/// \file json.hpp
/// \brief Records as JSON: what every executable writes for a script to read back (nlohmann-json).
///
/// The stages' `--json` lines, bench_gpu's sweep, the ceilings, stage 11's timelines and its
/// shared-memory map are built as Json values and written through the two functions below, so
/// that every string is escaped and every file is JSON, whatever a title or a GPU's name holds.
/// Both write floating-point numbers as printf's %g does, to six significant digits, as the
/// course's records have always carried them: the timers and the float32 sums they come from
/// promise no more, and committed results would otherwise change in digits that mean nothing each
/// time they are measured again. A whole number is written without a fraction (2621440). NaN and
/// infinity, which JSON cannot spell, are written as null.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace fa {

/// A JSON value whose objects keep their members in the order they were added, the order a
/// reader of the file sees them in.
using Json = nlohmann::ordered_json;

/// `value` as the text of a file: an object or array that holds only numbers, strings, booleans
/// and null on one line (one record, one mark, one step of a road), any other one member per line,
/// indented by two spaces. Ends without a newline.
std::string json_text(const Json& value);

/// `record` on one line, as a JSON Lines file (one record per line) holds it. Ends without a newline.
std::string json_line(const Json& record);

/// Appends `record` to the JSON Lines file `path` as one line; throws InputError naming `option`
/// when the file cannot be opened or written.
void append_json_line(const std::string& path, const Json& record, const std::string& option = "--json");

/// Today's date in UTC, YYYY-MM-DD: the date every record carries.
std::string record_date();

}  // namespace fa
