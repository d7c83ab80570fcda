// The copies of a repeated block, as the reports show them: ops and block instances whose
// paths differ only in repeat indices ("h[3].attn.qkv.matmul", "h[7].attn.qkv.matmul") share
// a pattern ("h[*].attn.qkv.matmul"). The op table of the text and Markdown reports, the
// roofline chart and the JSON report's ops[] and params.by_block[] group by it (docs/reports.md,
// "Copies of a repeated block").
//
// Groups are found on ids, not strings: an instance's group is its parent's group and its own
// path part (any "[n]" read as one part "[*]"), an op's its instance's group, kind and ordinal.
// A 100,000-layer GPT has 1.5 million ops: a pattern string per op was most of the report's
// grouping work (issue 12); a string is made per group only.
#pragma once

#include "ir/Graph.h"

#include "llvm/ADT/StringRef.h"

#include <cstdint>
#include <string>
#include <vector>

namespace tally {

struct CopyGroups {
  struct Group {
    uint32_t first = 0;   ///< its first member (the lowest id)
    uint32_t members = 0; ///< how many ops (instances) it has
    /// Every copy its pattern names has a member. Always so for instances, and for an op
    /// written in a block (each copy runs it); not for an op made by a call of one copy alone
    /// (`h[2](y)` again in the model's forward).
    bool everyCopy = true;
  };
  std::vector<uint32_t> of;  ///< per op (instance) id: its group's index in `groups`
  std::vector<Group> groups; ///< in the order of their first members
};

/// The graph's block instances, grouped by their paths with every repeat index read as `*`.
CopyGroups instanceCopies(const Graph &g);

/// The graph's ops, grouped by the pattern of their paths: a forward op by its instance's
/// group (`instances`, from instanceCopies), kind and ordinal; another op by its forward op's
/// group and its kind.
CopyGroups opCopies(const Graph &g, const CopyGroups &instances);

/// A path with every repeat index read as `*`: "h[3].attn.qkv" → "h[*].attn.qkv".
std::string repeatPattern(llvm::StringRef path);

} // namespace tally
