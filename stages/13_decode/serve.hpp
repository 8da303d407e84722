/// \file stages/13_decode/serve.hpp
/// \brief The serving loop's host half (`stage13_decode --serve`): requests with seeded prompt
/// lengths, a pool of pages with a free list, continuous batching, and the memory the pages hold
/// against a cache allocated contiguously at the maximum length. Plain C++, tested without a GPU
/// (tests/test_stage13_serve.cpp); serve.cuh runs the kernels on what it plans.
///
/// One step of the loop, as an inference server runs it:
/// 1. **Admit.** While a slot of the batch is free (fewer than `max_batch` running) and the pool can
///    give the request at the head of the queue every page it will need, the request joins the
///    batch: its prompt's pages are taken from the free list, and its prompt is written into them
///    (the prefill, on the GPU). Requests are admitted in arrival order; one that does not fit
///    waits, and so do the ones behind it.
/// 2. **Grow.** Every running sequence is about to append one key. One whose length is a multiple
///    of the page size has a full last page: it takes a new page from the free list now, on demand.
/// 3. **Decode.** The batch's block tables and cached lengths go to stage 13's kernel (one new row
///    per sequence, appended in place).
/// 4. **Finish.** Each sequence has one more token; one that has its `decode_steps` new tokens ends,
///    and all its pages return to the free list at once, for the next request to take.
///
/// Every request here decodes exactly `decode_steps` tokens, so its final length is known when it
/// arrives, and admission counts the pages it will take by its end beside those the running
/// sequences will still take: the pool can never run dry in the middle of a step. A server does
/// not know when a sequence will stop; it admits on the prompt alone and, when the free list runs
/// out, preempts a sequence (vLLM frees its pages and computes them again later). Pages are still
/// taken when a length crosses a page boundary, not at admission: at every step the pages in use
/// are exactly the sequences' lengths rounded up to a page.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "decode_problem.hpp"
#include "fa/precision.hpp"
#include "serve_values.hpp"

namespace fa::stage13 {

/// How prompt lengths are drawn between prompt_min and prompt_max.
enum class PromptDistribution {
    Uniform,     ///< every length equally likely: the memory figure's plain case
    LogUniform,  ///< log(length) uniform: as many prompts from 128 to 256 keys as from 2048 to 4096
};

/// "uniform" or "log-uniform".
std::string to_string(PromptDistribution distribution);

/// What the serving loop runs: the requests and the cache's pages.
struct ServeConfig {
    int64_t requests = 256;       ///< --requests: all queued at the start, in arrival order
    int64_t max_batch = 64;       ///< --max-batch: sequences decoded together at most
    int64_t prompt_min = 128;     ///< --prompt-min: shortest prompt, in tokens (keys)
    int64_t prompt_max = 4096;    ///< --prompt-max: longest prompt
    PromptDistribution distribution = PromptDistribution::Uniform;  ///< --prompt-dist
    int64_t decode_steps = 128;   ///< --decode-steps: T, new tokens per request
    int64_t page_size = 64;       ///< --page-size: keys per page
    int64_t pool_pages = 0;       ///< --pool-pages; 0: derived_pool_pages()
    uint64_t seed = 42;           ///< --seed: the prompt lengths and every input value

    /// Pages one request takes by its end at most: ceil((prompt_max + T) / page_size), the block
    /// table's row length.
    int64_t pages_per_seq() const;
    /// The pool when --pool-pages is not given: max_batch x pages_per_seq(), so that every slot can
    /// hold the longest request and admission never waits on pages, only on slots.
    int64_t derived_pool_pages() const;
    /// pool_pages, or derived_pool_pages() when it is 0.
    int64_t pool() const { return pool_pages > 0 ? pool_pages : derived_pool_pages(); }
    /// Throws InputError naming the option and what is allowed: counts below 1, prompt_max below
    /// prompt_min, a page size not allowed, sizes past the kernels' 32-bit offsets, or a pool too
    /// small for one request of the longest prompt (nothing could ever be admitted).
    void validate() const;
    /// One line: `256 requests, prompts 128-4096 tokens (uniform, seed 42), 128 new tokens each, ...`.
    std::string describe() const;
};

/// The prompt lengths of the config's requests, in arrival order: seeded, from prompt_min to
/// prompt_max inclusive, drawn as `distribution` says.
std::vector<int64_t> draw_prompt_lengths(const ServeConfig& config);

/// A pool of `size` pages and its free list. A page is free or owned by one request; allocate()
/// takes the page freed last (a stack: a new request reuses the pages an old one left, in no order
/// of their numbers), release() gives a page back.
class PagePool {
public:
    /// `size` pages, all free (the free list holds them so that page 0 is taken first).
    explicit PagePool(int64_t size);
    /// Takes a free page for `owner`; InputError when the free list is empty.
    int32_t allocate(int owner);
    /// Returns `page` to the free list; std::logic_error when `owner` does not own it (a page freed
    /// twice, or by the wrong request: a bug of the scheduler, not of the input).
    void release(int32_t page, int owner);
    /// Pages in the pool.
    int64_t size() const { return int64_t(owner_.size()); }
    /// Pages on the free list.
    int64_t free_pages() const { return int64_t(free_.size()); }
    /// Pages owned by a request.
    int64_t in_use() const { return size() - free_pages(); }
    /// The most pages in use at once so far.
    int64_t peak_in_use() const { return peak_; }
    /// The request that owns `page`, -1 when it is free.
    int owner(int32_t page) const { return owner_[size_t(page)]; }

private:
    std::vector<int32_t> free_;  // the free list, taken from the back
    std::vector<int> owner_;     // owner_[page]: the request, or -1
    int64_t peak_ = 0;
};

/// One request and where it stands.
struct ServeRequest {
    int id = 0;                  ///< arrival order, from 0
    int64_t prompt = 0;          ///< prompt length
    int64_t generated = 0;       ///< new tokens decoded so far
    std::vector<int32_t> pages;  ///< its block table: page j holds keys j x page_size ..; empty once it ends
    int64_t admitted_step = -1;  ///< the step whose prefill wrote its prompt; -1 while waiting
    int64_t finished_step = -1;  ///< the step that decoded its last token; -1 until then

    /// Keys in its cache: the prompt and every decoded token.
    int64_t length() const { return prompt + generated; }
};

/// What one step runs: the prompts to write, then the batch to decode.
struct StepPlan {
    int64_t step = 0;                    ///< 0, 1, ...
    std::vector<int> admitted;           ///< requests admitted this step, whose prompts are prefilled first
    std::vector<int> running;            ///< the batch in order: request ids, those just admitted last
    std::vector<int64_t> cache_seqlens;  ///< (B,) keys each sequence holds before the step's append
    std::vector<int32_t> block_table;    ///< (B, pages_per_seq) row major, -1 past each sequence's pages
};

/// Continuous batching over a PagePool (the steps in this file's head).
class Scheduler {
public:
    /// The config's requests with these prompt lengths (one per request; validate() checked first).
    Scheduler(const ServeConfig& config, const std::vector<int64_t>& prompts);
    /// Admits and grows (steps 1 and 2): the plan of the next step. InputError when the batch is
    /// empty and the request at the head of the queue cannot be admitted (no page would ever free).
    StepPlan plan();
    /// Ends the planned step (step 4): every running sequence gains its token; those with all T
    /// tokens finish and free their pages. Returns the ids that finished.
    std::vector<int> complete();
    /// Whether every request has finished.
    bool done() const { return finished_ == int64_t(requests_.size()); }
    /// The requests, by id.
    const std::vector<ServeRequest>& requests() const { return requests_; }
    /// The pool.
    const PagePool& pool() const { return pool_; }
    /// Requests running now.
    int64_t running() const { return int64_t(running_.size()); }
    /// Requests not yet admitted.
    int64_t waiting() const { return int64_t(requests_.size()) - next_; }
    /// Requests finished.
    int64_t finished() const { return finished_; }
    /// Steps planned so far.
    int64_t steps() const { return step_; }
    /// New tokens decoded so far.
    int64_t tokens() const { return tokens_; }
    /// The most sequences running in one step.
    int64_t peak_running() const { return peak_running_; }
    /// Keys the running sequences held, after their appends, at the step with the most pages in
    /// use (the first such step): what the peak's pages had to hold.
    int64_t keys_at_peak() const { return keys_at_peak_; }
    /// Pages request `id` takes by its end: ceil((prompt + T) / page_size).
    int64_t pages_needed(int id) const;

private:
    ServeConfig config_;
    std::vector<ServeRequest> requests_;
    PagePool pool_;
    std::vector<int> running_;  // ids, in batch order
    int64_t next_ = 0;          // the first waiting request (arrival order)
    int64_t finished_ = 0;
    int64_t step_ = 0;
    int64_t tokens_ = 0;
    int64_t peak_running_ = 0;
    int64_t peak_pages_ = 0;
    int64_t keys_at_peak_ = 0;
};

/// The memory figure: what the pages held at their peak against a contiguous cache.
struct MemoryFigures {
    double row_bytes = 0;         ///< one key and its value: 2 x Hk x d x bytes per element
    double page_bytes = 0;        ///< page_size x row_bytes
    int64_t peak_pages = 0;       ///< the most pages in use at once
    double paged_bytes = 0;       ///< peak_pages x page_bytes
    double pool_bytes = 0;        ///< the whole pool: pool() x page_bytes
    /// max_batch x (prompt_max + T) x row_bytes: a cache that gives every slot the longest
    /// sequence, as an allocator that does not page must
    double contiguous_bytes = 0;
    double peak_keys = 0;         ///< keys held at the step with the most pages in use: the bytes actually needed
};

/// The figures for `config` at `peak_pages`, with `keys_at_peak` keys cached at that step, Hk K/V
/// heads of dimension `head_dim`, `element_bytes` per element.
MemoryFigures memory_figures(const ServeConfig& config, int64_t peak_pages, int64_t keys_at_peak, int64_t heads_k,
                             int64_t head_dim, int element_bytes);

/// The rows `first` .. `first + count - 1` of request `request` in `tensor` (count, heads, d),
/// serve_value()'s numbers rounded to `precision`: what the GPU wrote there.
std::vector<float> serve_rows(uint64_t seed, ServeTensor tensor, int request, int64_t first, int64_t count, int64_t heads,
                              int64_t head_dim, Precision precision);

/// What the closing check reads back from one decode step of the loop: a few of its sequences,
/// as the decoding problem of those alone, with their cache as the pages held it.
struct ServeSample {
    int64_t step = -1;           ///< the step sampled; -1: none
    std::vector<int> requests;   ///< the sequences, by request id
    std::vector<std::string> why;  ///< why each was picked ("the longest", "admitted this step", ...)
    DecodeProblem problem;       ///< their cached lengths before the step, one new row each, appended
    CacheGeometry geometry;      ///< a capacity that holds them (the inputs' contiguous layout)
    /// q as the kernel read it; k_cache, v_cache the rows read back from the pages (NaN past each
    /// length); k_new, v_new the row the step appended, read back from the pages too
    DecodeInputs inputs;
    std::vector<float> o;        ///< the kernel's O for them, (B', 1, Hq, d)
    std::vector<float> lse;      ///< the kernel's LSE, (B', Hq, 1)
};

/// Rows of the sample's cache (cached rows and the appended one, K and V) that differ, bit for
/// bit, from serve_rows(): 0 when the pages hold exactly what the prefill and the appends wrote.
int64_t rows_not_as_written(const ServeSample& sample, uint64_t seed, Precision precision);

}  // namespace fa::stage13
