// The registry of kv.h: each op's declaration, found by its id.
#include "kv.h"
#include "ops/serving.h"

namespace ps {

#define PS_OP_DECLARE(op, id, def) extern const OpDef def;
PS_OPS(PS_OP_DECLARE)
#undef PS_OP_DECLARE

namespace {

bool ServeUnknown(Serving& s) {
  s.Reply({}, "table '" + s.msg.meta.table() + "': unknown op " + std::to_string(s.msg.meta.op()));
  return true;
}

const OpDef kUnknownOp = {"unknown op", 0, ServeUnknown, nullptr, nullptr};

constexpr int kSlots = 64;  // op ids are small: a lookup is an index
struct Table {
  const OpDef* by_id[kSlots];
};

constexpr Table Register() {
  Table t{};
#define PS_OP_REGISTER(op, id, def)                    \
  static_assert(id > 0 && id < kSlots, "op id range"); \
  t.by_id[id] = &def;
  PS_OPS(PS_OP_REGISTER)
#undef PS_OP_REGISTER
  return t;
}

constexpr Table kTable = Register();

}  // namespace

const OpDef& OpOf(int op) {
  const OpDef* def = op > 0 && op < kSlots ? kTable.by_id[op] : nullptr;
  return def ? *def : kUnknownOp;
}

}  // namespace ps
