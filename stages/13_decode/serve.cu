#include "serve.cuh"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <limits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../07_pipelined_fused_kernel/attention.cuh"
#include "../11_hopper_kernel/attention.cuh"
#include "decode.cuh"
#include "fa/cuda/buffer.hpp"
#include "fa/cuda/check.hpp"
#include "fa/cuda/device.hpp"
#include "fa/cuda/round.cuh"
#include "fa/error.hpp"
#include "fa/problem.hpp"
#include "fa/tensor.hpp"

namespace fa::stage13 {

namespace {

// rows x (heads x d) values of `tensor` into `out` (rows, heads, d): row i is token positions[i]
// of request requests[i], or, where those are null, token first + i of request `request`.
template <class T>
__global__ void fill_rows_kernel(T* out, uint64_t seed, ServeTensor tensor, const int32_t* requests, const int32_t* positions,
                                 int request, int first, int rows, int row_elems) {
    const int64_t total = int64_t(rows) * row_elems;
    for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
        const int i = int(e / row_elems), x = int(e % row_elems);
        const int r = requests ? requests[i] : request, pos = positions ? positions[i] : first + i;
        // Rounded to nearest even, as the host's round_to(): both sides know the same bits.
        out[e] = cuda::from_float<T>(serve_value(seed, tensor, uint32_t(r), uint32_t(pos), uint32_t(x)));
    }
}

// Stage 11 has no grouped heads: kv (rows, Hk, d) repeated to (rows, Hk x G, d), query head h
// reading K/V head h / G. 16 bytes (8 elements) a thread.
__global__ void repeat_heads_kernel(const uint4* kv, uint4* out, int rows, int heads_k, int group, int chunks_per_head) {
    const int64_t total = int64_t(rows) * heads_k * group * chunks_per_head;
    for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
        const int64_t c = e % chunks_per_head, h = (e / chunks_per_head) % (int64_t(heads_k) * group), i = e / (chunks_per_head * int64_t(heads_k) * group);
        out[e] = kv[(i * heads_k + h / group) * chunks_per_head + c];
    }
}

// A prompt's rows (rows, Hk, d) into its pages: row j goes to row j % page_size of page
// pages[j / page_size] of the pool (num_pages, page_size, Hk, d). 16 bytes a thread.
__global__ void write_pages_kernel(const uint4* rows_in, uint4* pool, const int32_t* pages, int rows, int page_shift, int chunks_per_row) {
    const int64_t total = int64_t(rows) * chunks_per_row;
    for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
        const int64_t j = e / chunks_per_row, c = e % chunks_per_row;
        const int64_t page = pages[j >> page_shift], in_page = j & ((int64_t(1) << page_shift) - 1);
        pool[((page << page_shift) + in_page) * chunks_per_row + c] = rows_in[e];
    }
}

unsigned grid_for(int64_t work) { return unsigned(std::max<int64_t>(1, std::min<int64_t>(ceil_div(work, 256), 1 << 16))); }

float bits_to_float(uint16_t bits, Precision precision) {
    return precision == Precision::BFloat16 ? bf16_bits_to_float(bits) : half_to_float(bits);
}

template <class X>
std::vector<X> download(const X* device, size_t n) {
    std::vector<X> out(n);
    if (n > 0) FA_CUDA_CHECK(cudaMemcpy(out.data(), device, n * sizeof(X), cudaMemcpyDeviceToHost));
    return out;
}

// Elapsed milliseconds between two recorded events (waits for the second).
float elapsed_ms(cudaEvent_t from, cudaEvent_t to) {
    FA_CUDA_CHECK(cudaEventSynchronize(to));
    float ms = 0;
    FA_CUDA_CHECK(cudaEventElapsedTime(&ms, from, to));
    return ms;
}

bool use_stage11(PrefillKernel kernel) {
    return kernel == PrefillKernel::Stage11 || (kernel == PrefillKernel::Auto && stage11::gpu_unavailable_reason().empty());
}

// The loop in the 16-bit type T.
template <class T>
class Loop {
public:
    Loop(const ServeConfig& c, const ServeShape& s, PrefillKernel kernel)
        : c_(c), s_(s), stage11_(use_stage11(kernel)), sched_(c, draw_prompt_lengths(c)) {
        const int64_t Hq = s.heads_q, Hk = s.heads_k, d = s.head_dim, row = Hk * d, width = c.pages_per_seq();
        const int64_t pool_elems = c.pool() * c.page_size * row;
        k_pool_ = cuda::DeviceBuffer<T>(size_t(pool_elems)), v_pool_ = cuda::DeviceBuffer<T>(size_t(pool_elems));
        FA_CUDA_CHECK(cudaMemset(k_pool_.data(), 0xff, k_pool_.bytes()));  // NaN: a row read before it is written shows
        FA_CUDA_CHECK(cudaMemset(v_pool_.data(), 0xff, v_pool_.bytes()));
        const size_t Lq = size_t(c.prompt_max * Hq * d), Lk = size_t(c.prompt_max * row);
        q_prompt_ = cuda::DeviceBuffer<T>(Lq), o_prompt_ = cuda::DeviceBuffer<T>(Lq);
        k_prompt_ = cuda::DeviceBuffer<T>(Lk), v_prompt_ = cuda::DeviceBuffer<T>(Lk);
        if (stage11_ && Hq != Hk) k_repeat_ = cuda::DeviceBuffer<T>(Lq), v_repeat_ = cuda::DeviceBuffer<T>(Lq);
        lse_prompt_ = cuda::DeviceBuffer<float>(size_t(Hq * c.prompt_max));
        prompt_pages_ = cuda::DeviceBuffer<int32_t>(size_t(width));
        const size_t B = size_t(c.max_batch);
        q_ = cuda::DeviceBuffer<T>(B * size_t(Hq * d)), o_ = cuda::DeviceBuffer<T>(B * size_t(Hq * d));
        k_new_ = cuda::DeviceBuffer<T>(B * size_t(row)), v_new_ = cuda::DeviceBuffer<T>(B * size_t(row));
        lse_ = cuda::DeviceBuffer<float>(B * size_t(Hq));
        table_ = cuda::DeviceBuffer<int32_t>(B * size_t(width));
        seqlens_ = cuda::DeviceBuffer<int32_t>(B), ids_ = cuda::DeviceBuffer<int32_t>(B);
        FA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
        for (cudaEvent_t& e : events_) FA_CUDA_CHECK(cudaEventCreate(&e));
        sms_ = cuda::gpu_info().sm_count;
        blocks_per_sm_ = split_blocks_per_sm(d);
    }
    ~Loop() {
        for (cudaEvent_t e : events_) cudaEventDestroy(e);
        cudaStreamDestroy(stream_);
    }
    Loop(const Loop&) = delete;
    Loop& operator=(const Loop&) = delete;

    ServeResult run(bool progress) {
        ServeResult res;
        res.prefill = stage11_ ? "stage 11's forward (TMA, wgmma; sm_90a)" + std::string(s_.heads_q != s_.heads_k ? ", K and V repeated to Hq heads" : "")
                               : "stage 07's forward (mma.sync), grouped heads as stage 10 runs them";
        using clock = std::chrono::steady_clock;
        const auto start = clock::now();
        auto last_line = start;
        double read_back_s = 0;
        std::vector<double> step_ms;
        while (!sched_.done()) {
            const StepPlan plan = sched_.plan();
            for (int id : plan.admitted) prefill(id, res);
            step_ms.push_back(decode(plan, res));
            if (res.sample.step < 0 && sched_.waiting() == 0) {
                const auto t0 = clock::now();
                res.sample = read_back(plan);
                read_back_s += std::chrono::duration<double>(clock::now() - t0).count();
            }
            sched_.complete();
            const auto now = clock::now();
            if (progress && now - last_line >= std::chrono::seconds(1)) {
                last_line = now;
                const double s = std::chrono::duration<double>(now - start).count() - read_back_s;
                std::fprintf(stderr, "serve      step %lld: %lld running, %lld waiting, %lld finished; %lld of %lld pages in use; %.0f tokens/s so far\n",
                             (long long)sched_.steps(), (long long)sched_.running(), (long long)sched_.waiting(), (long long)sched_.finished(),
                             (long long)sched_.pool().in_use(), (long long)sched_.pool().size(), double(sched_.tokens()) / s);
            }
        }
        FA_CUDA_CHECK(cudaStreamSynchronize(stream_));
        res.wall_s = std::chrono::duration<double>(clock::now() - start).count() - read_back_s;
        res.steps = sched_.steps();
        res.decode_tokens = sched_.tokens();
        res.peak_running = sched_.peak_running();
        res.peak_pages = sched_.pool().peak_in_use();
        res.keys_at_peak = sched_.keys_at_peak();
        res.attention = summarize(step_ms);
        for (double ms : step_ms) res.attention_total_ms += ms;
        return res;
    }

private:
    // The prompt of request `id`: its q, k, v drawn, its causal attention, its K and V into its pages.
    void prefill(int id, ServeResult& res) {
        const ServeRequest& r = sched_.requests()[size_t(id)];
        const int L = int(r.prompt), Hq = int(s_.heads_q), Hk = int(s_.heads_k), d = int(s_.head_dim);
        fill(q_prompt_.data(), ServeTensor::Q, nullptr, nullptr, id, L, Hq * d);
        fill(k_prompt_.data(), ServeTensor::K, nullptr, nullptr, id, L, Hk * d);
        fill(v_prompt_.data(), ServeTensor::V, nullptr, nullptr, id, L, Hk * d);
        FA_CUDA_CHECK(cudaMemcpyAsync(prompt_pages_.data(), r.pages.data(), r.pages.size() * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
        Problem pr;
        pr.batch = 1, pr.heads = Hq, pr.seq_q = L, pr.seq_k = L, pr.head_dim = d, pr.causal = true;
        const auto view = [&](const T* p, int heads) { return make_view<const T>(p, 1, heads, L, d, Layout::BNHD); };
        const View4<T> o = make_view<T>(o_prompt_.data(), 1, Hq, L, d, Layout::BNHD);
        const View3<float> lse = make_view3<float>(lse_prompt_.data(), 1, Hq, L);
        FA_CUDA_CHECK(cudaEventRecord(events_[0], stream_));
        if (stage11_) {
            const T* k = k_prompt_.data();
            const T* v = v_prompt_.data();
            if (Hq != Hk) {
                const int chunks = d / 8;
                const int64_t work = int64_t(L) * Hq * chunks;
                repeat_heads_kernel<<<grid_for(work), 256, 0, stream_>>>(reinterpret_cast<const uint4*>(k_prompt_.data()),
                                                                         reinterpret_cast<uint4*>(k_repeat_.data()), L, Hk, Hq / Hk, chunks);
                FA_CUDA_CHECK_LAUNCH("stage 13 repeat_heads_kernel");
                repeat_heads_kernel<<<grid_for(work), 256, 0, stream_>>>(reinterpret_cast<const uint4*>(v_prompt_.data()),
                                                                         reinterpret_cast<uint4*>(v_repeat_.data()), L, Hk, Hq / Hk, chunks);
                FA_CUDA_CHECK_LAUNCH("stage 13 repeat_heads_kernel");
                k = k_repeat_.data(), v = v_repeat_.data();
            }
            stage11::attention_device(pr, view(q_prompt_.data(), Hq), view(k, Hq), view(v, Hq), o, lse, stream_);
        } else {
            stage07::ModelOptions options;
            options.kv_heads = Hk;
            stage07::attention_device(pr, options, view(q_prompt_.data(), Hq), view(k_prompt_.data(), Hk), view(v_prompt_.data(), Hk), o,
                                      lse, stream_);
        }
        FA_CUDA_CHECK(cudaEventRecord(events_[1], stream_));
        int shift = 0;
        while ((int64_t(1) << shift) < c_.page_size) ++shift;
        const int chunks_per_row = Hk * d / 8;
        for (auto [from, pool] : {std::pair{k_prompt_.data(), k_pool_.data()}, std::pair{v_prompt_.data(), v_pool_.data()}}) {
            write_pages_kernel<<<grid_for(int64_t(L) * chunks_per_row), 256, 0, stream_>>>(
                reinterpret_cast<const uint4*>(from), reinterpret_cast<uint4*>(pool), prompt_pages_.data(), L, shift, chunks_per_row);
            FA_CUDA_CHECK_LAUNCH("stage 13 write_pages_kernel");
        }
        FA_CUDA_CHECK(cudaEventRecord(events_[2], stream_));
        res.prefill_attention_ms += elapsed_ms(events_[0], events_[1]);
        res.page_write_ms += elapsed_ms(events_[1], events_[2]);
        res.prefill_flops += 2.0 * double(Hq) * double(L) * double(L) * double(d);
        res.prefill_tokens += L;
    }

    void fill(T* out, ServeTensor tensor, const int32_t* requests, const int32_t* positions, int request, int rows, int row_elems) {
        fill_rows_kernel<T><<<grid_for(int64_t(rows) * row_elems), 256, 0, stream_>>>(out, c_.seed, tensor, requests, positions, request, 0,
                                                                                      rows, row_elems);
        FA_CUDA_CHECK_LAUNCH("stage 13 fill_rows_kernel");
    }

    // The decoding problem of a planned step, its cache geometry, checked as every call of the stage is.
    std::pair<DecodeProblem, CacheGeometry> step_problem(const StepPlan& plan) const {
        DecodeProblem p = make_decode_problem(plan.cache_seqlens, 1, s_.heads_q, s_.heads_k, s_.head_dim, true);
        CacheGeometry g;
        g.page_size = c_.page_size, g.pages_per_seq = c_.pages_per_seq(), g.num_pages = c_.pool(), g.block_table = plan.block_table;
        g.validate(p);  // a page reached by two sequences, or a table shorter than a sequence, is refused here
        return {p, g};
    }

    // One decode step of the running batch: new q, k, v for each sequence, the call, timed.
    double decode(const StepPlan& plan, ServeResult& res) {
        const auto [p, g] = step_problem(plan);
        const int B = int(p.batch()), Hq = int(s_.heads_q), Hk = int(s_.heads_k), d = int(s_.head_dim);
        const SplitChoice split = choose_splits(p, sms_, blocks_per_sm_);
        if (split.splits > 1) {
            const size_t o_floats = size_t(partial_o_floats(p, split.splits)), lse_floats = size_t(partial_lse_floats(p, split.splits));
            if (o_partial_.size() < o_floats) o_partial_ = cuda::DeviceBuffer<float>(o_floats);
            if (lse_partial_.size() < lse_floats) lse_partial_ = cuda::DeviceBuffer<float>(lse_floats);
        }
        std::vector<int32_t> lens(plan.cache_seqlens.begin(), plan.cache_seqlens.end()), ids(plan.running.begin(), plan.running.end());
        FA_CUDA_CHECK(cudaMemcpyAsync(table_.data(), plan.block_table.data(), plan.block_table.size() * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
        FA_CUDA_CHECK(cudaMemcpyAsync(seqlens_.data(), lens.data(), lens.size() * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
        FA_CUDA_CHECK(cudaMemcpyAsync(ids_.data(), ids.data(), ids.size() * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
        // Each sequence's new token sits at position cache_seqlens[b] of its request.
        fill(q_.data(), ServeTensor::Q, ids_.data(), seqlens_.data(), 0, B, Hq * d);
        fill(k_new_.data(), ServeTensor::K, ids_.data(), seqlens_.data(), 0, B, Hk * d);
        fill(v_new_.data(), ServeTensor::V, ids_.data(), seqlens_.data(), 0, B, Hk * d);
        CallPointers<T> ptr;
        ptr.q = q_.data(), ptr.k_new = k_new_.data(), ptr.v_new = v_new_.data(), ptr.k_cache = k_pool_.data(), ptr.v_cache = v_pool_.data();
        ptr.block_table = table_.data(), ptr.cache_seqlens = seqlens_.data(), ptr.o = o_.data(), ptr.lse = lse_.data();
        ptr.o_partial = o_partial_.data(), ptr.lse_partial = lse_partial_.data();
        FA_CUDA_CHECK(cudaEventRecord(events_[0], stream_));
        decode_device<T>(p, g, CacheKind::Paged, split.splits, ptr, stream_);
        FA_CUDA_CHECK(cudaEventRecord(events_[1], stream_));
        res.decode_kv_bytes += p.kv_bytes(2);
        return elapsed_ms(events_[0], events_[1]);  // also waits: the host vectors above outlive their copies
    }

    // A few sequences of the step just run, read back: the longest, the shortest, the one nearest
    // its end, and the last admitted (its prompt just written by the prefill).
    ServeSample read_back(const StepPlan& plan) {
        ServeSample s;
        s.step = plan.step;
        const auto& reqs = sched_.requests();
        const size_t n = plan.running.size();
        const auto pick = [&](size_t b, const std::string& why) {
            for (size_t i = 0; i < s.requests.size(); ++i) {
                if (s.requests[i] == plan.running[b]) return void(s.why[i] += ", " + why);
            }
            s.requests.push_back(plan.running[b]), s.why.push_back(why), chosen_.push_back(b);
        };
        chosen_.clear();
        size_t longest = 0, shortest = 0, nearest = 0;
        for (size_t b = 1; b < n; ++b) {
            if (plan.cache_seqlens[b] > plan.cache_seqlens[longest]) longest = b;
            if (plan.cache_seqlens[b] < plan.cache_seqlens[shortest]) shortest = b;
            if (reqs[size_t(plan.running[b])].generated > reqs[size_t(plan.running[nearest])].generated) nearest = b;
        }
        pick(longest, "the longest");
        pick(shortest, "the shortest");
        pick(nearest, "the nearest its end");
        pick(n - 1, plan.admitted.empty() ? "the last admitted" : "admitted this step");
        const int64_t Hq = s_.heads_q, Hk = s_.heads_k, d = s_.head_dim, row = Hk * d, P = c_.page_size, width = c_.pages_per_seq();
        std::vector<int64_t> lens;
        for (size_t b : chosen_) lens.push_back(plan.cache_seqlens[b]);
        s.problem = make_decode_problem(lens, 1, Hq, Hk, d, true);
        s.geometry = make_paged_geometry(s.problem, P, c_.seed);  // only its capacity is used: the inputs are contiguous
        const int64_t cap = s.geometry.capacity(), B = s.problem.batch();
        const float nan = std::numeric_limits<float>::quiet_NaN();
        s.inputs.k_cache.assign(size_t(B * cap * row), nan), s.inputs.v_cache = s.inputs.k_cache;
        s.inputs.k_new.resize(size_t(B * row)), s.inputs.v_new.resize(size_t(B * row));
        s.inputs.q.resize(size_t(B * Hq * d)), s.o.resize(size_t(B * Hq * d)), s.lse.resize(size_t(B * Hq));
        for (int64_t i = 0; i < B; ++i) {
            const size_t b = chosen_[size_t(i)];
            const int64_t len = lens[size_t(i)];
            for (auto [pool, cache, appended] : {std::tuple{k_pool_.data(), &s.inputs.k_cache, &s.inputs.k_new},
                                                 std::tuple{v_pool_.data(), &s.inputs.v_cache, &s.inputs.v_new}}) {
                for (int64_t j = 0; j * P < len + 1; ++j) {
                    const int32_t page = plan.block_table[size_t(int64_t(b) * width + j)];
                    const int64_t rows = std::min(P, len + 1 - j * P);
                    const std::vector<T> got = download(pool + page * P * row, size_t(rows * row));
                    for (int64_t r = 0; r < rows; ++r) {
                        const int64_t key = j * P + r;
                        float* to = key < len ? cache->data() + (i * cap + key) * row : appended->data() + i * row;
                        for (int64_t x = 0; x < row; ++x) to[x] = to_float(got[size_t(r * row + x)]);
                    }
                }
            }
            const std::vector<T> q = download(q_.data() + b * size_t(Hq * d), size_t(Hq * d));
            const std::vector<T> o = download(o_.data() + b * size_t(Hq * d), size_t(Hq * d));
            const std::vector<float> lse = download(lse_.data() + b * size_t(Hq), size_t(Hq));
            for (int64_t x = 0; x < Hq * d; ++x) s.inputs.q[size_t(i * Hq * d + x)] = to_float(q[size_t(x)]), s.o[size_t(i * Hq * d + x)] = to_float(o[size_t(x)]);
            std::copy(lse.begin(), lse.end(), s.lse.begin() + long(i * Hq));
        }
        return s;
    }

    float to_float(T x) const {
        uint16_t bits;
        static_assert(sizeof(T) == sizeof(uint16_t), "a 16-bit type");
        std::memcpy(&bits, &x, sizeof(bits));
        return bits_to_float(bits, s_.precision);
    }

    ServeConfig c_;
    ServeShape s_;
    bool stage11_ = false;
    Scheduler sched_;
    cuda::DeviceBuffer<T> k_pool_, v_pool_;                         // (pool pages, page_size, Hk, d)
    cuda::DeviceBuffer<T> q_prompt_, o_prompt_, k_prompt_, v_prompt_;  // one prompt: (L, Hq or Hk, d)
    cuda::DeviceBuffer<T> k_repeat_, v_repeat_;                     // (L, Hq, d), stage 11 with grouped heads
    cuda::DeviceBuffer<float> lse_prompt_;                          // (Hq, L)
    cuda::DeviceBuffer<int32_t> prompt_pages_;                      // the admitted request's block table
    cuda::DeviceBuffer<T> q_, o_, k_new_, v_new_;                   // the step: (B, 1, Hq or Hk, d)
    cuda::DeviceBuffer<float> lse_, o_partial_, lse_partial_;
    cuda::DeviceBuffer<int32_t> table_, seqlens_, ids_;             // (B, pages_per_seq), (B,), (B,)
    cudaStream_t stream_ = nullptr;
    cudaEvent_t events_[3] = {};
    int sms_ = 1, blocks_per_sm_ = 1;
    std::vector<size_t> chosen_;  // batch rows of the sample
};

}  // namespace

std::string prefill_unavailable_reason(PrefillKernel kernel) {
    return kernel == PrefillKernel::Stage11 ? stage11::gpu_unavailable_reason() : std::string();
}

ServeResult run_serve(const ServeConfig& config, const ServeShape& shape, PrefillKernel kernel, bool progress) {
    if (shape.precision == Precision::BFloat16) {
        Loop<__nv_bfloat16> loop(config, shape, kernel);
        return loop.run(progress);
    }
    if (shape.precision == Precision::Float16) {
        Loop<__half> loop(config, shape, kernel);
        return loop.run(progress);
    }
    throw InputError("stage 13 computes in bf16 or fp16: --dtype bf16 or fp16");
}

double serve_device_bytes(const ServeConfig& c, const ServeShape& s) {
    const double row = double(s.heads_k * s.head_dim), q_row = double(s.heads_q * s.head_dim);
    const double pool = 2.0 * double(c.pool()) * double(c.page_size) * row * 2;
    const double prompt = (2.0 * q_row + 2.0 * row + 2.0 * q_row) * double(c.prompt_max) * 2 + q_row / s.head_dim * double(c.prompt_max) * 4;
    const double step = double(c.max_batch) * (2.0 * q_row + 2.0 * row) * 2;
    return pool + prompt + step;
}

}  // namespace fa::stage13
