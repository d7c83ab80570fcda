// SvgCharts.h — the HTML report's charts, each drawn as one SVG element from an Analysis.
// They place and label numbers the passes computed; the only arithmetic is geometry (scales)
// and an op's attained rate, its FLOPs over its time (both from passes/StepTime.cpp).
#pragma once

#include "support/Diagnostics.h"
#include "passes/Analysis.h"

#include <string>

namespace tally {

/// The colours of the charts' data marks (also used by the page's legends).
namespace chartcolor {
inline constexpr const char *ComputeBound = "#1f77b4";
inline constexpr const char *MemoryBound = "#ff7f0e";
inline constexpr const char *LaunchBound = "#8c564b";
inline constexpr const char *Forward = "#4c72b0";
inline constexpr const char *Backward = "#dd8452";
inline constexpr const char *Time = "#55a868";
inline constexpr const char *Curve = "#8172b3";
inline constexpr const char *Chosen = "#c44e52";
} // namespace chartcolor

/// The target's roofline: the memory ceiling (bandwidth × intensity), the compute ceiling
/// (the rate matrix products run at), the ridge, and every op (copies of a repeated block as
/// one point) at its intensity and attained rate, coloured by bound, with a hover title
/// giving its path, source line and numbers. Empty when no op takes time.
std::string rooflineChart(const Analysis &a, const DiagnosticEngine &diags);

/// Memory per device as one bar stacked by kind, against the device's capacity and the plan's
/// memory budget (when it has one).
std::string memoryChart(const Analysis &a);

/// Forward and backward FLOPs per step and time per step of each top-level block.
std::string blocksChart(const Analysis &a);

/// The checkpoint trade-off curve (recompute FLOPs against activation + workspace bytes) with
/// the chosen point and the memory limit; empty when the plan computed no options (only
/// `checkpoint = auto` does).
std::string checkpointChart(const Analysis &a);

/// The pipeline schedule as a timeline: one row per stage, a box per forward and backward of
/// each micro-batch (and chunk, when interleaved), idle time left blank; empty without a
/// pipeline.
std::string pipelineChart(const Analysis &a);

} // namespace tally
