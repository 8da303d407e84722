#include "fa/json.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>

#include "fa/error.hpp"

namespace fa {

namespace {

// nlohmann's text of a number, string, boolean or null, a string's bytes that are not UTF-8 (a
// GPU's or CPU's name could hold some) replaced rather than refused.
std::string dump(const Json& leaf) { return leaf.dump(-1, ' ', false, Json::error_handler_t::replace); }

// A number, string, boolean or null. A floating-point number is rounded to six significant
// digits (json.hpp says why) and, when that leaves a whole number, written as one (2621440, not
// 2621440.0), as printf's %g writes it; NaN and infinity stay as they are, for nlohmann to write as
// null.
std::string leaf_text(const Json& leaf) {
    if (!leaf.is_number_float()) return dump(leaf);
    char six[32];
    std::snprintf(six, sizeof six, "%.6g", leaf.get<double>());
    const double x = std::strtod(six, nullptr);
    if (std::isfinite(x) && x == std::trunc(x) && std::fabs(x) < 1e15) return dump(Json(int64_t(x)));
    return dump(Json(x));
}

// Appends `value` to `out`. `depth` < 0: all on one line; otherwise the depth of `value`, whose
// members go one per line, indented by two spaces a level, unless every one of them is a leaf.
void write(std::string& out, const Json& value, int depth) {
    if (!value.is_structured()) {
        out += leaf_text(value);
        return;
    }
    const bool object = value.is_object();
    const bool one_line = depth < 0 || std::none_of(value.begin(), value.end(), [](const Json& m) { return m.is_structured(); });
    const auto new_line = [&out](int level) {
        out += '\n';
        out.append(2 * size_t(level), ' ');
    };
    out += object ? '{' : '[';
    for (auto m = value.begin(); m != value.end(); ++m) {
        if (m != value.begin()) out += one_line ? ", " : ",";
        if (!one_line) new_line(depth + 1);
        if (object) out += dump(Json(m.key())) + ": ";
        write(out, m.value(), one_line ? -1 : depth + 1);
    }
    if (!one_line) new_line(depth);
    out += object ? '}' : ']';
}

}  // namespace

std::string json_text(const Json& value) {
    std::string out;
    write(out, value, 0);
    return out;
}

std::string json_line(const Json& record) {
    std::string out;
    write(out, record, -1);
    return out;
}

void append_json_line(const std::string& path, const Json& record, const std::string& option) {
    std::ofstream out(path, std::ios::app);
    if (!out) throw InputError(option + ": cannot open " + path + " for appending");
    out << json_line(record) << '\n';
    if (!out) throw InputError(option + ": writing " + path + " failed");
}

std::string record_date() {
    const std::time_t now = std::time(nullptr);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%d", std::gmtime(&now));
    return buf;
}

}  // namespace fa
