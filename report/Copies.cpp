// Copies of a repeated block (report/Copies.h).
#include "report/Copies.h"

#include "llvm/ADT/DenseMap.h"

#include <cctype>
#include <utility>

namespace tally {

std::string repeatPattern(llvm::StringRef path) {
  std::string out;
  out.reserve(path.size());
  for (size_t i = 0; i < path.size(); ++i) {
    if (path[i] == '[') {
      size_t j = i + 1;
      while (j < path.size() && std::isdigit(static_cast<unsigned char>(path[j])))
        ++j;
      if (j < path.size() && path[j] == ']' && j > i + 1) {
        out += "[*]";
        i = j;
        continue;
      }
    }
    out += path[i];
  }
  return out;
}

namespace {

/// Adds member `id` to the group `key` names (a new group when it names none yet).
template <class Key>
void join(CopyGroups &c, llvm::DenseMap<Key, uint32_t> &index, const Key &key, uint32_t id) {
  auto [it, inserted] = index.try_emplace(key, static_cast<uint32_t>(c.groups.size()));
  if (inserted)
    c.groups.push_back({id, 0, true});
  ++c.groups[it->second].members;
  c.of.push_back(it->second);
}

} // namespace

CopyGroups instanceCopies(const Graph &g) {
  CopyGroups c;
  c.of.reserve(g.instances.size());
  // A part's pattern, once per distinct part (parts are pooled: a deep model has a few dozen).
  llvm::DenseMap<const std::string *, const std::string *> partPattern;
  llvm::DenseMap<std::pair<uint32_t, const std::string *>, uint32_t> index;
  for (uint32_t i = 0; i < g.instances.size(); ++i) {
    const Instance &in = g.instances[i];
    auto [p, added] = partPattern.try_emplace(in.part, in.part);
    if (added) {
      std::string pattern = repeatPattern(*in.part);
      if (pattern != *in.part)
        p->second = &pooledName(pattern);
    }
    // The parent is made before its children (Instance::parent); the model, or a broken link,
    // starts a path of its own, as Graph::instancePath reads it.
    uint32_t parent = in.parent < i ? c.of[in.parent] : kNone;
    join(c, index, std::make_pair(parent, p->second), i);
  }
  return c;
}

CopyGroups opCopies(const Graph &g, const CopyGroups &instances) {
  CopyGroups c;
  c.of.reserve(g.ops.size());
  // Keys: (what the path starts from, what it adds). A forward op starts from its instance's
  // group and adds its kind and ordinal; another op from its forward op's group and adds its
  // kind; an op whose path cannot be read so (a broken graph) is a group of its own.
  constexpr uint64_t kFromOp = 1ull << 62, kAlone = 1ull << 61;
  llvm::DenseMap<std::pair<uint64_t, uint64_t>, uint32_t> index;
  for (OpId i = 0; i < g.ops.size(); ++i) {
    const Op &op = g.ops[i];
    uint64_t kind = static_cast<uint64_t>(op.kind);
    std::pair<uint64_t, uint64_t> key;
    if (op.phase == Phase::Forward && op.instance < instances.of.size())
      key = {instances.of[op.instance], (kind << 32) | op.ordinal};
    else if (op.phase != Phase::Forward && op.forwardOp < i &&
             g.ops[op.forwardOp].phase == Phase::Forward)
      key = {kFromOp | c.of[op.forwardOp], kind};
    else
      key = {kAlone | i, kind};
    join(c, index, key, i);
  }
  // An op group has every copy when it has a member per member of what its path starts from.
  for (CopyGroups::Group &gr : c.groups) {
    const Op &op = g.ops[gr.first];
    if (op.phase == Phase::Forward && op.instance < instances.of.size())
      gr.everyCopy = gr.members == instances.groups[instances.of[op.instance]].members;
    else if (op.phase != Phase::Forward && op.forwardOp < gr.first &&
             g.ops[op.forwardOp].phase == Phase::Forward) {
      const CopyGroups::Group &from = c.groups[c.of[op.forwardOp]];
      gr.everyCopy = from.everyCopy && gr.members == from.members;
    } else
      gr.everyCopy = gr.members == 1;
  }
  return c;
}

} // namespace tally
