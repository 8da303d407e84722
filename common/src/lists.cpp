#include "fa/lists.hpp"

#include <climits>
#include <exception>
#include <sstream>

#include "fa/error.hpp"

namespace fa {

std::vector<std::string> split_list(const std::string& text, char sep) {
    std::vector<std::string> items;
    std::string item;
    std::istringstream in(text);
    while (std::getline(in, item, sep)) items.push_back(item);
    if (!text.empty() && text.back() == sep) items.push_back("");
    return items;
}

int64_t parse_whole(const std::string& item, const std::string& option, const std::string& text, int64_t lowest) {
    size_t used = 0;
    long long value = 0;
    try {
        value = std::stoll(item, &used);
    } catch (const std::exception&) {
        used = 0;
    }
    const bool digits = !item.empty() && item.find_first_not_of("-0123456789") == std::string::npos;
    if (!digits || used != item.size() || value < lowest || value > INT32_MAX) {
        throw InputError(option + " " + text + ": '" + item + "' is not a whole number from " + std::to_string(lowest) +
                         " to 2147483647");
    }
    return value;
}

std::vector<int64_t> parse_lengths(const std::string& text, const std::string& option, const std::string& example) {
    const std::vector<std::string> items = split_list(text, ',');
    if (items.empty()) throw InputError(option + " is empty: give one length per sequence, e.g. " + option + " " + example);
    std::vector<int64_t> out;
    for (const std::string& item : items) out.push_back(parse_whole(item, option, text, 0));
    return out;
}

}  // namespace fa
