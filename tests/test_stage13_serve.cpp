// Stage 13's serving loop, host half (stages/13_decode/serve.hpp): the page pool and its free list,
// continuous batching with admission in arrival order, the block tables and lengths of every step,
// the memory figures, the refusals, the seeded prompt lengths and the input values the GPU and the
// host both compute. No GPU: this runs in CI.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "fa/error.hpp"
#include "stages/13_decode/serve.hpp"

namespace {

using namespace fa;
using namespace fa::stage13;

// Three requests of 20, 16 and 40 prompt tokens, 4 new tokens each, two at a time, pages of 16 keys:
// the case the figures below are worked out by hand on.
ServeConfig small_config() {
    ServeConfig c;
    c.requests = 3, c.max_batch = 2, c.prompt_min = 1, c.prompt_max = 40, c.decode_steps = 4, c.page_size = 16;
    return c;
}

// Every step of a whole run: the plan's lengths and tables agree with the requests, no page is in two
// tables, each running sequence holds exactly the pages its length after the append needs, and the
// pool counts what the tables hold. Returns the plans.
std::vector<StepPlan> run_checked(Scheduler& s, const ServeConfig& c) {
    std::vector<StepPlan> plans;
    while (!s.done()) {
        REQUIRE(plans.size() < 100000);
        StepPlan p = s.plan();
        REQUIRE(p.cache_seqlens.size() == p.running.size());
        REQUIRE(p.block_table.size() == p.running.size() * size_t(c.pages_per_seq()));
        REQUIRE(int64_t(p.running.size()) <= c.max_batch);
        std::set<int32_t> seen;
        int64_t held = 0;
        for (size_t b = 0; b < p.running.size(); ++b) {
            const ServeRequest& r = s.requests()[size_t(p.running[b])];
            CHECK(p.cache_seqlens[b] == r.prompt + r.generated);
            const int64_t need = ceil_div(p.cache_seqlens[b] + 1, c.page_size);  // after this step's append
            CHECK(int64_t(r.pages.size()) == need);
            for (int64_t j = 0; j < c.pages_per_seq(); ++j) {
                const int32_t page = p.block_table[b * size_t(c.pages_per_seq()) + size_t(j)];
                if (j >= need) {
                    CHECK(page == -1);
                    continue;
                }
                CHECK(page == r.pages[size_t(j)]);
                CHECK(s.pool().owner(page) == r.id);
                CHECK(seen.insert(page).second);  // no page owned twice
            }
            held += need;
        }
        CHECK(held == s.pool().in_use());
        plans.push_back(p);
        s.complete();
    }
    return plans;
}

}  // namespace

TEST_CASE("the small case, step by step") {
    const ServeConfig c = small_config();
    CHECK(c.pages_per_seq() == 3);  // ceil((40 + 4) / 16)
    CHECK(c.pool() == 6);           // derived: 2 slots x 3 pages
    Scheduler s(c, {20, 16, 40});
    const std::vector<StepPlan> plans = run_checked(s, c);
    REQUIRE(plans.size() == 8);
    // Step 0: both first requests admitted; request 0 takes pages 0 and 1 for 20 keys, request 1
    // page 2 for 16 keys, then page 3 on demand for its 17th key.
    CHECK(plans[0].admitted == std::vector<int>{0, 1});
    CHECK(plans[0].cache_seqlens == std::vector<int64_t>{20, 16});
    CHECK(plans[0].block_table == std::vector<int32_t>{0, 1, -1, 2, 3, -1});
    for (int t = 1; t < 4; ++t) {
        CHECK(plans[size_t(t)].admitted.empty());
        CHECK(plans[size_t(t)].cache_seqlens == std::vector<int64_t>{20 + t, 16 + t});
    }
    // Step 4: both finished after 4 tokens, their pages back on the free list; request 2 takes the
    // pages freed last first (3, 2, 1) for its 40 keys.
    CHECK(plans[4].admitted == std::vector<int>{2});
    CHECK(plans[4].running == std::vector<int>{2});
    CHECK(plans[4].block_table == std::vector<int32_t>{3, 2, 1});
    for (int t = 4; t < 8; ++t) CHECK(plans[size_t(t)].cache_seqlens == std::vector<int64_t>{40 + t - 4});
    CHECK(s.tokens() == 12);
    CHECK(s.steps() == 8);
    CHECK(s.peak_running() == 2);
    CHECK(s.requests()[0].admitted_step == 0);
    CHECK(s.requests()[0].finished_step == 3);
    CHECK(s.requests()[2].admitted_step == 4);
    CHECK(s.requests()[2].finished_step == 7);
    // Every page back on the free list.
    CHECK(s.pool().free_pages() == 6);
    CHECK(s.pool().in_use() == 0);
    for (int32_t page = 0; page < 6; ++page) CHECK(s.pool().owner(page) == -1);

    SUBCASE("the memory figures") {
        // Peak: 4 pages at step 0, holding 21 + 17 keys after the append.
        CHECK(s.pool().peak_in_use() == 4);
        CHECK(s.keys_at_peak() == 38);
        // Hk 2, d 64, bf16: a key and its value take 2 x 2 x 64 x 2 = 512 bytes; a page of 16, 8192.
        const MemoryFigures m = memory_figures(c, s.pool().peak_in_use(), s.keys_at_peak(), 2, 64, 2);
        CHECK(m.row_bytes == 512);
        CHECK(m.page_bytes == 8192);
        CHECK(m.paged_bytes == 4 * 8192);
        CHECK(m.pool_bytes == 6 * 8192);
        CHECK(m.contiguous_bytes == 2 * 44 * 512);  // 2 slots of prompt_max + T = 44 keys
        CHECK(m.peak_keys == 38);
    }
}

TEST_CASE("admission waits for pages, in arrival order") {
    ServeConfig c = small_config();
    c.pool_pages = 3;  // one request's worth: the smallest pool allowed
    Scheduler s(c, {20, 16, 40});
    const std::vector<StepPlan> plans = run_checked(s, c);
    // A slot is free at step 0, but request 1's 2 pages are not (request 0 holds 2 and is owed none
    // more; 1 is left): it waits until request 0 ends, and request 2 (3 pages) until request 1 ends.
    CHECK(plans[0].admitted == std::vector<int>{0});
    CHECK(s.requests()[1].admitted_step == 4);
    CHECK(s.requests()[2].admitted_step == 8);
    CHECK(plans.size() == 12);
    CHECK(s.peak_running() == 1);
    CHECK(s.pool().free_pages() == 3);
}

TEST_CASE("a larger run keeps every invariant") {
    for (const PromptDistribution dist : {PromptDistribution::Uniform, PromptDistribution::LogUniform}) {
        for (const int64_t pool : {int64_t(0), int64_t(24)}) {
            ServeConfig c;
            c.requests = 60, c.max_batch = 7, c.prompt_min = 1, c.prompt_max = 100, c.decode_steps = 9, c.page_size = 16;
            c.pool_pages = pool, c.distribution = dist, c.seed = 7;
            Scheduler s(c, draw_prompt_lengths(c));
            const std::vector<StepPlan> plans = run_checked(s, c);
            CHECK(s.tokens() == 60 * 9);
            CHECK(s.pool().in_use() == 0);
            CHECK(s.pool().free_pages() == s.pool().size());
            CHECK(s.pool().peak_in_use() <= c.pool());
            int64_t previous = 0;
            for (const ServeRequest& r : s.requests()) {
                CHECK(r.generated == 9);
                CHECK(r.finished_step - r.admitted_step == 8);  // one token a step, from its first step
                CHECK(r.admitted_step >= previous);             // admitted in arrival order
                CHECK(r.pages.empty());
                previous = r.admitted_step;
            }
            // Decoded tokens: one per running sequence and step.
            int64_t rows = 0;
            for (const StepPlan& p : plans) rows += int64_t(p.running.size());
            CHECK(rows == s.tokens());
        }
    }
}

TEST_CASE("the page pool") {
    PagePool pool(3);
    CHECK(pool.allocate(5) == 0);
    CHECK(pool.allocate(5) == 1);
    CHECK(pool.allocate(6) == 2);
    CHECK(pool.peak_in_use() == 3);
    CHECK_THROWS_WITH_AS(pool.allocate(7), doctest::Contains("the pool of 3 pages is exhausted"), InputError);
    CHECK_THROWS_AS(pool.release(2, 5), std::logic_error);  // not its page
    pool.release(1, 5);
    CHECK_THROWS_AS(pool.release(1, 5), std::logic_error);  // freed twice
    CHECK(pool.free_pages() == 1);
    CHECK(pool.allocate(8) == 1);  // the page freed last comes first
    CHECK(pool.owner(1) == 8);
}

TEST_CASE("refusals name the option and what is allowed") {
    const auto refuses = [](ServeConfig c, const char* words) {
        CHECK_THROWS_WITH_AS(c.validate(), doctest::Contains(words), InputError);
    };
    ServeConfig c = small_config();
    c.validate();
    refuses([&] { auto x = c; x.requests = 0; return x; }(), "--requests 0: give 1 to");
    refuses([&] { auto x = c; x.max_batch = 0; return x; }(), "--max-batch 0: give 1 to 65535");
    refuses([&] { auto x = c; x.prompt_min = 0; return x; }(), "--prompt-min 0: a prompt has at least 1 token");
    refuses([&] { auto x = c; x.prompt_min = 50; return x; }(), "--prompt-max 40: give a length from --prompt-min (50)");
    refuses([&] { auto x = c; x.decode_steps = 0; return x; }(), "--decode-steps 0: give 1 to");
    refuses([&] { auto x = c; x.page_size = 24; return x; }(), "--page-size 24 is not allowed");
    refuses([&] { auto x = c; x.pool_pages = -1; return x; }(), "--pool-pages -1");
    refuses([&] { auto x = c; x.pool_pages = 2; return x; }(), "--pool-pages 2 cannot hold one request of the longest prompt: 40 + 4 keys take 3 pages");
    refuses([&] { auto x = c; x.max_batch = 60000; x.prompt_max = 1 << 20; return x; }(), "more than 2147483647 keys");
    CHECK_THROWS_WITH_AS(Scheduler(c, {20, 16}), doctest::Contains("2 prompt lengths for 3 requests"), InputError);
    CHECK_THROWS_WITH_AS(Scheduler(c, {20, 16, 41}), doctest::Contains("request 2 has a prompt of 41 tokens"), InputError);
}

TEST_CASE("prompt lengths: seeded, within the bounds, of the distribution asked") {
    ServeConfig c;
    c.requests = 4000, c.prompt_min = 128, c.prompt_max = 4096;
    const std::vector<int64_t> a = draw_prompt_lengths(c);
    CHECK(a == draw_prompt_lengths(c));
    ServeConfig other = c;
    other.seed = 43;
    CHECK(a != draw_prompt_lengths(other));
    double mean = 0;
    for (int64_t n : a) {
        CHECK(n >= 128);
        CHECK(n <= 4096);
        mean += double(n) / double(a.size());
    }
    CHECK(std::abs(mean - 2112.0) < 60);  // uniform: the middle
    CHECK(std::find(a.begin(), a.end(), 4096) != a.end());  // both ends can be drawn
    c.distribution = PromptDistribution::LogUniform;
    std::vector<int64_t> g = draw_prompt_lengths(c);
    std::sort(g.begin(), g.end());
    CHECK(g.front() >= 128);
    CHECK(g.back() <= 4096);
    CHECK(std::abs(double(g[g.size() / 2]) - std::sqrt(128.0 * 4097.0)) < 60);  // log-uniform: the median near the geometric mean
    c.prompt_min = c.prompt_max = 77;
    for (int64_t n : draw_prompt_lengths(c)) CHECK(n == 77);
}

TEST_CASE("the input values: centred, of unit spread, bounded, the same from every call") {
    double sum = 0, squares = 0;
    const int n = 200000;
    for (int i = 0; i < n; ++i) {
        const float x = serve_value(42, ServeTensor::K, uint32_t(i % 97), uint32_t(i / 97), uint32_t(i % 1024));
        CHECK(std::abs(x) < 3.47f);
        CHECK(x == serve_value(42, ServeTensor::K, uint32_t(i % 97), uint32_t(i / 97), uint32_t(i % 1024)));
        sum += x, squares += double(x) * x;
    }
    CHECK(std::abs(sum / n) < 0.01);
    CHECK(std::abs(std::sqrt(squares / n) - 1.0) < 0.01);
    CHECK(serve_value(42, ServeTensor::K, 1, 2, 3) != serve_value(42, ServeTensor::V, 1, 2, 3));
    CHECK(serve_value(42, ServeTensor::K, 1, 2, 3) != serve_value(43, ServeTensor::K, 1, 2, 3));
    const std::vector<float> rows = serve_rows(42, ServeTensor::Q, 3, 10, 2, 4, 64, Precision::BFloat16);
    REQUIRE(rows.size() == 2 * 4 * 64);
    CHECK(rows[4 * 64 + 5] == round_to(Precision::BFloat16, serve_value(42, ServeTensor::Q, 3, 11, 5)));
}

TEST_CASE("rows_not_as_written finds a row the pages do not hold") {
    ServeSample s;
    s.requests = {4, 9};
    s.problem = make_decode_problem({5, 17}, 1, 4, 2, 64, true);
    s.geometry = make_paged_geometry(s.problem, 16, 1);
    const int64_t row = 2 * 64, cap = s.geometry.capacity();
    s.inputs.k_cache.assign(size_t(2 * cap * row), std::numeric_limits<float>::quiet_NaN());
    s.inputs.v_cache = s.inputs.k_cache;
    s.inputs.k_new.resize(size_t(2 * row)), s.inputs.v_new.resize(size_t(2 * row));
    for (int64_t b = 0; b < 2; ++b) {
        const int64_t len = s.problem.cache_seqlens[size_t(b)];
        for (const auto& [tensor, cache, appended] : {std::tuple{ServeTensor::K, &s.inputs.k_cache, &s.inputs.k_new},
                                                      std::tuple{ServeTensor::V, &s.inputs.v_cache, &s.inputs.v_new}}) {
            const std::vector<float> want = serve_rows(42, tensor, s.requests[size_t(b)], 0, len + 1, 2, 64, Precision::Float16);
            std::copy_n(want.begin(), len * row, cache->begin() + long(b * cap * row));
            std::copy_n(want.begin() + long(len * row), row, appended->begin() + long(b * row));
        }
    }
    CHECK(rows_not_as_written(s, 42, Precision::Float16) == 0);
    CHECK(rows_not_as_written(s, 43, Precision::Float16) == 2 * (6 + 18));  // another seed: every row differs
    s.inputs.v_cache[size_t((1 * cap + 16) * row + 7)] += 1.0f;  // one value of sequence 1's 17th key
    CHECK(rows_not_as_written(s, 42, Precision::Float16) == 1);
    s.inputs.k_new[3] = -s.inputs.k_new[3];  // the appended row of sequence 0
    CHECK(rows_not_as_written(s, 42, Precision::Float16) == 2);
}
