// What every generated CPU specialization shares: weight pointers by plan index, the scratch
// arena (one allocation, sized by the compiler), the step's sanity checks, and the attention view
// of the batch. Included by generated code only.
#pragma once

#include <memory>
#include <vector>

#include "kernels/cpu/attn_batch.hpp"
#include "runtime/core/dtype.hpp"
#include "runtime/core/thread_pool.hpp"
#include "runtime/model/compiled_model.hpp"
#include "runtime/weights/weight_set.hpp"

namespace scr {

class GeneratedModel : public CompiledModel {
public:
    GeneratedModel(const ModelInfo& info, const WeightSet& weights, ThreadPool& pool, int64_t scratch_floats);
    ~GeneratedModel() override;
    const ModelInfo& info() const override { return info_; }

protected:
    template <typename T>
    const T* w(int index) const { return static_cast<const T*>(weights_[size_t(index)]); }
    const void* const* wp(int index) const { return weights_.data() + index; }
    float* scratch() { return scratch_; }
    ThreadPool& pool() { return pool_; }
    // Checks the batch against the compiled limits and the KV pool (a bad batch is an scr::Error,
    // never an out-of-bounds access) and maps tokens to their sequences.
    void begin_step(const StepBatch& b, const KvPool& kv);
    kernels::cpu::AttnBatch attn_batch(const StepBatch& b) const;

private:
    const ModelInfo& info_;
    std::vector<const void*> weights_;
    float* scratch_ = nullptr;
    std::vector<int32_t> seq_of_token_;
    ThreadPool& pool_;
};

template <typename M>
std::unique_ptr<CompiledModel> make_generated(const WeightSet& w, ThreadPool& pool) {
    return std::make_unique<M>(w, pool);
}

}  // namespace scr
