#include "serve.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <numeric>
#include <sstream>
#include <stdexcept>
#include <tuple>

#include "decode_problem.hpp"
#include "fa/error.hpp"
#include "fa/problem.hpp"
#include "serve_values.hpp"

namespace fa::stage13 {

namespace {

constexpr int64_t kMaxRequests = 1 << 20;
constexpr int64_t kMaxPrompt = 1 << 20;  // the prefill's scratch holds one prompt of this many tokens at most

}  // namespace

std::string to_string(PromptDistribution distribution) {
    return distribution == PromptDistribution::Uniform ? "uniform" : "log-uniform";
}

int64_t ServeConfig::pages_per_seq() const { return ceil_div(prompt_max + decode_steps, page_size); }

int64_t ServeConfig::derived_pool_pages() const { return max_batch * pages_per_seq(); }

void ServeConfig::validate() const {
    if (requests < 1 || requests > kMaxRequests) {
        throw InputError("--requests " + std::to_string(requests) + ": give 1 to " + std::to_string(kMaxRequests) + " requests");
    }
    if (max_batch < 1 || max_batch > 65535) {
        throw InputError("--max-batch " + std::to_string(max_batch) + ": give 1 to 65535 sequences decoded together");
    }
    if (prompt_min < 1) {
        throw InputError("--prompt-min " + std::to_string(prompt_min) + ": a prompt has at least 1 token");
    }
    if (prompt_max < prompt_min || prompt_max > kMaxPrompt) {
        throw InputError("--prompt-max " + std::to_string(prompt_max) + ": give a length from --prompt-min (" +
                         std::to_string(prompt_min) + ") to " + std::to_string(kMaxPrompt) + " tokens");
    }
    if (decode_steps < 1 || decode_steps > kMaxPrompt) {
        throw InputError("--decode-steps " + std::to_string(decode_steps) + ": give 1 to " + std::to_string(kMaxPrompt) +
                         " new tokens per request");
    }
    check_page_size(page_size);
    if (pool_pages < 0) {
        throw InputError("--pool-pages " + std::to_string(pool_pages) + ": give the pages of the pool (at least " +
                         std::to_string(pages_per_seq()) + "), or leave it out for max-batch x pages of the longest request");
    }
    if (pool_pages > 0 && pool_pages < pages_per_seq()) {
        throw InputError("--pool-pages " + std::to_string(pool_pages) + " cannot hold one request of the longest prompt: " +
                         std::to_string(prompt_max) + " + " + std::to_string(decode_steps) + " keys take " +
                         std::to_string(pages_per_seq()) + " pages of " + std::to_string(page_size) +
                         ", so nothing could be admitted; give --pool-pages at least " + std::to_string(pages_per_seq()));
    }
    // The kernels' offsets are 32-bit: the pool's rows and the batch's keys must stay below 2^31.
    if (double(pool()) * double(page_size) > double(INT32_MAX)) {
        throw InputError("a pool of " + std::to_string(pool()) + " pages of " + std::to_string(page_size) +
                         " keys holds more than 2147483647 keys: give a smaller --pool-pages, --max-batch or --prompt-max");
    }
    if (double(max_batch) * double(prompt_max + decode_steps) > double(INT32_MAX)) {
        throw InputError("--max-batch " + std::to_string(max_batch) + " sequences of up to " +
                         std::to_string(prompt_max + decode_steps) + " keys exceed 2147483647 keys in one call (int32 offsets)");
    }
}

std::string ServeConfig::describe() const {
    std::ostringstream s;
    s << requests << " requests, prompts of " << prompt_min << " to " << prompt_max << " tokens (" << to_string(distribution)
      << ", seed " << seed << "), " << decode_steps << " new tokens each, at most " << max_batch << " decoded together";
    return s.str();
}

std::vector<int64_t> draw_prompt_lengths(const ServeConfig& c) {
    std::vector<int64_t> out(size_t(c.requests));
    const double lo = std::log(double(c.prompt_min)), hi = std::log(double(c.prompt_max) + 1.0);
    for (int64_t i = 0; i < c.requests; ++i) {
        // One hash per request (serve_values.hpp's), 53 bits of it as a uniform u in [0, 1).
        const uint64_t h = serve_mix(c.seed * 0x9e3779b97f4a7c15ull + 0x51ed5eedull + uint64_t(i) * 0xd1342543de82ef95ull);
        const double u = double(h >> 11) * 0x1.0p-53;
        int64_t n = 0;
        if (c.distribution == PromptDistribution::Uniform) {
            n = c.prompt_min + int64_t(u * double(c.prompt_max - c.prompt_min + 1));
        } else {
            n = int64_t(std::floor(std::exp(lo + u * (hi - lo))));  // log uniform over [min, max + 1)
        }
        out[size_t(i)] = std::clamp(n, c.prompt_min, c.prompt_max);
    }
    return out;
}

PagePool::PagePool(int64_t size) : owner_(size_t(std::max<int64_t>(0, size)), -1) {
    free_.resize(owner_.size());
    // Taken from the back: page 0 first, then 1, ... while nothing has been freed.
    for (size_t i = 0; i < free_.size(); ++i) free_[i] = int32_t(free_.size() - 1 - i);
}

int32_t PagePool::allocate(int owner) {
    if (free_.empty()) {
        throw InputError("the pool of " + std::to_string(size()) + " pages is exhausted: give a larger --pool-pages");
    }
    const int32_t page = free_.back();
    free_.pop_back();
    owner_[size_t(page)] = owner;
    peak_ = std::max(peak_, in_use());
    return page;
}

void PagePool::release(int32_t page, int owner) {
    if (page < 0 || page >= size() || owner_[size_t(page)] != owner) {
        throw std::logic_error("page " + std::to_string(page) + " released by request " + std::to_string(owner) + ", which does not own it");
    }
    owner_[size_t(page)] = -1;
    free_.push_back(page);
}

Scheduler::Scheduler(const ServeConfig& config, const std::vector<int64_t>& prompts) : config_(config), pool_(0) {
    config_.validate();
    if (int64_t(prompts.size()) != config_.requests) {
        throw InputError(std::to_string(prompts.size()) + " prompt lengths for " + std::to_string(config_.requests) + " requests");
    }
    pool_ = PagePool(config_.pool());
    requests_.resize(prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
        if (prompts[i] < 1 || prompts[i] > config_.prompt_max) {
            throw InputError("request " + std::to_string(i) + " has a prompt of " + std::to_string(prompts[i]) +
                             " tokens: give 1 to --prompt-max (" + std::to_string(config_.prompt_max) + ")");
        }
        requests_[i].id = int(i), requests_[i].prompt = prompts[i];
    }
}

int64_t Scheduler::pages_needed(int id) const {
    return ceil_div(requests_[size_t(id)].prompt + config_.decode_steps, config_.page_size);
}

StepPlan Scheduler::plan() {
    StepPlan p;
    p.step = step_++;
    //! [admit]
    // 1. Admit, in arrival order, while a slot is free and the pool can give the request every page
    //    it will need beside the pages the running sequences will still take.
    int64_t owed = 0;
    for (int id : running_) owed += pages_needed(id) - int64_t(requests_[size_t(id)].pages.size());
    while (next_ < int64_t(requests_.size()) && int64_t(running_.size()) < config_.max_batch) {
        ServeRequest& r = requests_[size_t(next_)];
        const int64_t need = pages_needed(r.id);
        if (pool_.free_pages() - owed < need) break;  // it waits, and every request behind it
        const int64_t prompt_pages = ceil_div(r.prompt, config_.page_size);
        for (int64_t j = 0; j < prompt_pages; ++j) r.pages.push_back(pool_.allocate(r.id));
        owed += need - prompt_pages;
        r.admitted_step = p.step;
        running_.push_back(r.id);
        p.admitted.push_back(r.id);
        ++next_;
    }
    //! [admit]
    if (running_.empty() && next_ < int64_t(requests_.size())) {
        const ServeRequest& r = requests_[size_t(next_)];
        throw InputError("request " + std::to_string(r.id) + " needs " + std::to_string(pages_needed(r.id)) + " pages and the pool of " +
                         std::to_string(pool_.size()) + " has " + std::to_string(pool_.free_pages()) +
                         " free with nothing running: give a larger --pool-pages");
    }
    //! [grow]
    // 2. Grow: a sequence whose last page is full takes a new one for the key this step appends.
    const int64_t width = config_.pages_per_seq();
    p.running = running_;
    p.block_table.assign(size_t(int64_t(running_.size()) * width), -1);
    int64_t keys = 0;
    for (size_t b = 0; b < running_.size(); ++b) {
        ServeRequest& r = requests_[size_t(running_[b])];
        if (r.length() % config_.page_size == 0) r.pages.push_back(pool_.allocate(r.id));
        p.cache_seqlens.push_back(r.length());
        std::copy(r.pages.begin(), r.pages.end(), p.block_table.begin() + long(int64_t(b) * width));
        keys += r.length() + 1;
    }
    //! [grow]
    peak_running_ = std::max(peak_running_, int64_t(running_.size()));
    if (pool_.in_use() > peak_pages_) peak_pages_ = pool_.in_use(), keys_at_peak_ = keys;
    return p;
}

std::vector<int> Scheduler::complete() {
    std::vector<int> done_now;
    std::vector<int> still;
    for (int id : running_) {
        ServeRequest& r = requests_[size_t(id)];
        ++r.generated;
        ++tokens_;
        //! [finish]
        if (r.generated == config_.decode_steps) {
            for (int32_t page : r.pages) pool_.release(page, id);  // every page at once, back on the free list
            r.pages.clear();
            //! [finish]
            r.finished_step = step_ - 1;
            ++finished_;
            done_now.push_back(id);
        } else {
            still.push_back(id);
        }
    }
    running_ = still;
    return done_now;
}

MemoryFigures memory_figures(const ServeConfig& c, int64_t peak_pages, int64_t keys_at_peak, int64_t heads_k, int64_t head_dim,
                             int element_bytes) {
    MemoryFigures m;
    m.row_bytes = 2.0 * double(heads_k) * double(head_dim) * element_bytes;
    m.page_bytes = double(c.page_size) * m.row_bytes;
    m.peak_pages = peak_pages;
    m.paged_bytes = double(peak_pages) * m.page_bytes;
    m.pool_bytes = double(c.pool()) * m.page_bytes;
    m.contiguous_bytes = double(c.max_batch) * double(c.prompt_max + c.decode_steps) * m.row_bytes;
    m.peak_keys = double(keys_at_peak);
    return m;
}

std::vector<float> serve_rows(uint64_t seed, ServeTensor tensor, int request, int64_t first, int64_t count, int64_t heads,
                              int64_t head_dim, Precision precision) {
    const int64_t row = heads * head_dim;
    std::vector<float> out(size_t(count * row));
    for (int64_t i = 0; i < count; ++i)
        for (int64_t x = 0; x < row; ++x)
            out[size_t(i * row + x)] = round_to(precision, serve_value(seed, tensor, uint32_t(request), uint32_t(first + i), uint32_t(x)));
    return out;
}

int64_t rows_not_as_written(const ServeSample& s, uint64_t seed, Precision precision) {
    const DecodeProblem& p = s.problem;
    const int64_t row = p.heads_k * p.head_dim, cap = s.geometry.capacity();
    int64_t bad = 0;
    const auto differs = [&](const float* got, const std::vector<float>& want, int64_t r) {
        return !same_bits(std::vector<float>(got, got + row), std::vector<float>(want.begin() + long(r * row), want.begin() + long((r + 1) * row)));
    };
    for (int64_t b = 0; b < p.batch(); ++b) {
        const int64_t len = p.cache_seqlens[size_t(b)];
        const int id = s.requests[size_t(b)];
        for (const auto& [tensor, cache, appended] : {std::tuple{ServeTensor::K, &s.inputs.k_cache, &s.inputs.k_new},
                                                      std::tuple{ServeTensor::V, &s.inputs.v_cache, &s.inputs.v_new}}) {
            const std::vector<float> want = serve_rows(seed, tensor, id, 0, len + 1, p.heads_k, p.head_dim, precision);
            for (int64_t j = 0; j < len; ++j) bad += differs(cache->data() + (b * cap + j) * row, want, j);
            bad += differs(appended->data() + b * row, want, len);
        }
    }
    return bad;
}

}  // namespace fa::stage13
