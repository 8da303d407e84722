/// \file fa/lists.hpp
/// \brief Lists given on the command line as text ("1000,37,0", "3,0/2,1"): split, and read as
/// whole numbers with a message that names the option, the list and the item that is wrong.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fa {

/// The items of `text` separated by `sep`, empty items kept ("1,,2," gives "1", "", "2", "").
std::vector<std::string> split_list(const std::string& text, char sep);

/// `item` as a whole number from `lowest` to 2^31 - 1 (digits and a leading '-' only: no spaces,
/// no '+'); InputError "OPTION TEXT: 'ITEM' is not a whole number from LOWEST to 2147483647".
int64_t parse_whole(const std::string& item, const std::string& option, const std::string& text, int64_t lowest);

/// One length from 0 per comma-separated item of `text`; an empty list is refused with `example`
/// as the form to give ("OPTION is empty: give one length per sequence, e.g. OPTION EXAMPLE").
std::vector<int64_t> parse_lengths(const std::string& text, const std::string& option, const std::string& example);

}  // namespace fa
