// Internal: CUDA launchers of engine/optim.cu.
#pragma once
#include <cstdint>
#include <vector>

namespace ditto { class Context; }

namespace ditto::cuda {
// One parameter's update operands: its values, gradient, first state (SGD's momentum buffer, or null
// without momentum; Adam's m) and second state (Adam's v), n elements each.
struct ParamRef {
  float* p = nullptr;
  const float* grad = nullptr;
  float* a = nullptr;
  float* b = nullptr;
  int64_t n = 0;
};

// Each launcher updates a whole list of parameters in one launch per kParamsPerLaunch of them (a
// step's optimizer is one or a few kernels, not one per parameter). Every element's update is the
// same float expression, in the same order, as a parameter updated alone (and as the CPU reference),
// so the list's length and grouping change no bit.
//
// skip (sgd): the loss scaler's overflow flag, or null; when it is set the update writes nothing.
void sgd_update(Context& ctx, const std::vector<ParamRef>& ps, float lr, float momentum, bool nesterov, float wd,
                const int32_t* skip = nullptr);
void adam_update(Context& ctx, const std::vector<ParamRef>& ps, float step_size, float b1, float b2, float eps,
                 float bias2_sqrt, float wd);
// The same updates with their per-step scalars read from row *cursor of a device table (CUDA
// graphs; see Optimizer::plan): sgd reads lr, adam reads step_size and bias2_sqrt.
void sgd_update_table(Context& ctx, const std::vector<ParamRef>& ps, const float* table, const int32_t* cursor,
                      int width, float momentum, bool nesterov, float wd, const int32_t* skip = nullptr);
void adam_update_table(Context& ctx, const std::vector<ParamRef>& ps, const float* table, const int32_t* cursor,
                       int width, float b1, float b2, float eps, float wd);
// Adam under a skip flag (Optimizer::set_skip_flag): nothing when *skip is set; else the update
// of step t = *updates + 1, with lr by value or, when table is set, from column 2 of row *cursor,
// and the bias corrections c1[t-1] (double), bias2_sqrt[t-1]. count_update then advances *updates
// unless *skip.
void adam_update_counted(Context& ctx, const std::vector<ParamRef>& ps, float lr, const float* table,
                         const int32_t* cursor, int width, const double* c1, const float* bias2_sqrt,
                         const int32_t* updates, const int32_t* skip, float b1, float b2, float eps, float wd);
void count_update(Context& ctx, int32_t* updates, const int32_t* skip);
void advance_cursor(Context& ctx, int32_t* cursor);  // *cursor += 1, in stream order
}  // namespace ditto::cuda
