"""Sequential specifications (models) for the linearizability engine, Porcupine style.

A `Model` is a record of callbacks, as in Porcupine's `Model` struct: `init()`
gives the initial state and `step(state, input, output) -> (ok, new_state)` says
whether the operation could take effect in that state with that result, and what
state follows. `equal`, `hash`, `partition`, `describe_operation` and
`describe_state` are optional and filled with defaults when absent. States must be
immutable (tuples, strings, numbers, None): the engine caches them.

Inputs and outputs are derived from the op record (docs/history-format.md):
the input is `Input(f, value)` with the invoke's `value`, the output is
`Output(type, value)` with the completion's type (`"ok"` or `"info"`) and
value (`None` for `info`). JSON lists and objects are frozen into tuples and
`FrozenDict`s so that they can live in states. `fail` operations never reach a
model (they did not happen); an `info` operation may or may not have happened,
so a model's step for it answers "could it take effect here, and how", and the
engine is free never to linearize it.

`partition(ops)` receives the paired operations (`checkers.linear.Op`, with
`key`, `input`, `output`, `call`, `ret`) and returns a list of lists of them;
without it the engine partitions by the ops' `key`.

Beyond Porcupine's callbacks a model may give the engine more, to make it
fast; all of it is optional with safe defaults:

- `compile(input, output)` returns a one-argument function `state -> new state`
  (or `ILLEGAL`) specialised for one operation, so the search never dispatches
  on `f` in its inner loop; returning `None` for an `info` op says it can never
  have a visible effect and may be dropped.
- `read_only(input, output)` says the op never changes the state when legal,
  which lets the engine linearize it as soon as it is legal (see
  `checkers.linear.engine`, rule R1).
- `prepare(ops)` rewrites the operation list of one partition before the
  search where the model's reading of the history needs it (the lease model
  merges idempotent retries); `prune(ops)` then drops ops that provably cannot
  change the verdict (each rule proven in its docstring). `faults(history)`
  sees the raw history, nemesis ops included, before pairing and may add the
  effects a fault is allowed to have (the lease model: invalidation at a
  backend failure). The brute-force
  reference checker runs `prepare` but not `prune`, so tests verify pruning.

A model also says which `f`s it models (`fs`; every registered model does): a history
with other client `f`s is not a history of the model's object, and judging its
namesakes (a fenced-append `read` reads the store, not a register) would convict
it of a violation it cannot have. `fencelab check --model` refuses such a
history by name (`unmodelled_fs`, `models_taking`), and the `Linearizable`
checker calls it "unknown", never false.

Models (`MODELS`, `get_model(name)`):

- `register`: `read` (ok value = current value, `None` when unset) and `write v`.
- `cas-register`: Jepsen's: `read`, `write v`, `cas [old, new]`; a `cas` that
  completed `ok` matched; a failed one is a `fail` op and is dropped.
- `mutex`: `acquire` / `release` with value `null`; the state is "held".
- `fenced-register`: a register guarded by fencing tokens.
  `write` invoke value `{"value": v, "token": t}` (t an integer); its ok value
  is `true`, `null` or `{"accepted": true}` when the write was accepted and
  `false` or `{"accepted": false}` when it was rejected as stale. A write is
  accepted iff `t >=` the token of the last accepted write (any token is
  accepted while none is stored); acceptance stores `(v, t)`, rejection changes
  nothing. `read`: invoke `null`, ok value `{"value": v, "token": t}` (the last
  accepted write; `token` may be omitted to compare the value only) or a bare
  value. An `info` write may have been accepted (if its token was high enough).
- `lease`: the contract's lease for one lock identity (partition = `key`),
  with the op values of docs/history-format.md. The state is the current
  lease (id, token, expiry, status), the highest token allocated and the
  commit high-water mark. Expiry is not a separate step: it is judged with the
  ops' own backend times, so an answered `acquire` is legal iff the previous
  lease is released, revoked, or expired at the new lease's `acquired_at_ms`
  (`expires_at_ms <= acquired_at_ms`), and its token exceeds every earlier
  one; `renew` needs the current active lease unexpired at `renewed_at_ms`;
  `release` / `force-release` / `revoke` need the current active lease;
  `inspect` must report the current lease in its state (active, or its
  terminal record: released, revoked, expired; by lease_id also a superseded
  lease's terminal record; `null` is always accepted: it carries no time);
  `commit` needs the current active lease unexpired at `validated_at_ms` and
  a token not below the high-water mark; the final `read`'s `token` must be
  the high-water mark. An ok renew, release or commit whose reply names
  another lease or token than the client sent (`value.sent`) is never legal.
  Retries with the same `request_id` are one operation, and a lease only an
  unanswered acquire can have granted is accepted when first seen (rules L1,
  L2 in `prepare_lease`).
- `kv`: Porcupine's key-value model: per-key string state, `get` (ok value the
  string, `null` read as `""`), `put v`, `append v`; partitioned by `key`.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable, Collection
from operator import itemgetter
from typing import Any, NamedTuple

__all__ = [
    "ILLEGAL",
    "LEASE_FS",
    "FrozenDict",
    "Input",
    "MODELS",
    "Model",
    "ModelError",
    "Output",
    "SCALARS",
    "freeze",
    "get_model",
]


class _Illegal:
    """The sentinel a compiled step returns when the operation cannot take effect."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "ILLEGAL"


ILLEGAL: Any = _Illegal()


class ModelError(ValueError):
    """An operation the model cannot interpret (wrong `f` or value shape)."""


class Input(NamedTuple):
    """A model input: the function and the (frozen) invoke value."""

    f: str
    value: Any


class Output(NamedTuple):
    """A model output: `"ok"` or `"info"`, and the (frozen) completion value (`None` for info)."""

    type: str
    value: Any


class FrozenDict(dict):
    """A hashable dict for JSON objects inside inputs, outputs and states (never mutated)."""

    __slots__ = ()

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(frozenset(self.items()))


# the JSON scalar types `freeze` returns as they are (the pairing of checkers.linear asks the same question)
SCALARS = frozenset((type(None), int, str, float, bool))


def freeze(value: Any) -> Any:
    """Turn a JSON value into a hashable one: lists become tuples, objects FrozenDicts.

    Values keep Python equality, so JSON `true` equals `1` (as in most JSON tools).
    """
    if value.__class__ in SCALARS:
        return value
    if isinstance(value, list | tuple):
        return tuple(freeze(v) for v in value)
    if isinstance(value, dict):
        return FrozenDict((k, freeze(v)) for k, v in value.items())
    return value


def _one_bucket(_state: Any) -> int:
    """The hash used with a custom `equal` and no `hash`: every state in one bucket."""
    return 0


def _identity(ops: list) -> list:
    """The default prepare / prune: the ops unchanged."""
    return ops


def _default_equal(a: Any, b: Any) -> bool:
    """Default state equality (Porcupine's ShallowEqual)."""
    return a == b


def _default_describe_operation(inp: Any, out: Any) -> str:
    """Default operation description: `f(value) -> result`."""
    if isinstance(inp, Input) and isinstance(out, Output):
        arg = "" if inp.value is None else repr(inp.value)
        res = "?" if out.type == "info" else repr(out.value)
        return f"{inp.f}({arg}) -> {res}"
    return f"{inp!r} -> {out!r}"


@dataclasses.dataclass(frozen=True)
class Model:
    """A sequential specification; optional callbacks are filled with defaults (see the module doc)."""

    name: str
    init: Callable[[], Any]
    step: Callable[[Any, Any, Any], tuple[bool, Any]]
    equal: Callable[[Any, Any], bool] | None = None
    hash: Callable[[Any], int] | None = None
    partition: Callable[[list], list[list]] | None = None
    describe_operation: Callable[[Any, Any], str] | None = None
    describe_state: Callable[[Any], str] | None = None
    compile: Callable[[Any, Any], Callable[[Any], Any] | None] | None = None
    read_only: Callable[[Any, Any], bool] | None = None
    prepare: Callable[[list], list] | None = None
    prune: Callable[[list], list] | None = None
    faults: Callable[[list[dict]], list[dict]] | None = None
    # the `f`s the model gives a meaning to (None: not declared); a history with others is no history of this
    # model's object, whatever its ops of the same names (a fenced-append `read` reads the store, not a register)
    fs: frozenset[str] | None = None
    native_states: bool = dataclasses.field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        """Check the required callbacks and fill the optional ones (Porcupine's fillDefault)."""
        if not callable(self.init) or not callable(self.step):
            raise ModelError(f"model {self.name!r} needs callable init and step")
        custom_eq = self.equal not in (None, _default_equal) or self.hash not in (None, hash)
        fill = object.__setattr__
        # States can be used directly as cache keys unless equality or hashing is custom.
        fill(self, "native_states", not custom_eq)
        if self.equal is None:
            fill(self, "equal", _default_equal)
        if self.hash is None:
            # With a custom equal but no hash, all states share one bucket (always consistent).
            fill(self, "hash", _one_bucket if custom_eq else hash)
        if self.describe_operation is None:
            fill(self, "describe_operation", _default_describe_operation)
        if self.describe_state is None:
            fill(self, "describe_state", repr)
        if self.compile is None:
            fill(self, "compile", self._compile_from_step)
        if self.read_only is None:
            fill(self, "read_only", lambda _i, _o: False)
        if self.prepare is None:
            fill(self, "prepare", _identity)
        if self.prune is None:
            fill(self, "prune", _identity)
        if self.faults is None:
            fill(self, "faults", _identity)

    def _compile_from_step(self, inp: Any, out: Any) -> Callable[[Any], Any]:
        """The default `compile`: wrap `step` for one operation."""
        step = self.step

        def stepper(state: Any) -> Any:
            ok, new = step(state, inp, out)
            return new if ok else ILLEGAL

        return stepper


def _step_from_compile(compile_: Callable[[Any, Any], Callable[[Any], Any] | None]):
    """Build Porcupine's `step(state, input, output)` from a model's `compile`."""

    def step(state: Any, inp: Any, out: Any) -> tuple[bool, Any]:
        fn = compile_(inp, out)
        if fn is None:  # an info op that never has a visible effect: "did not happen"
            return True, state
        new = fn(state)
        return (False, state) if new is ILLEGAL else (True, new)

    return step


def _bad(model: str, inp: Input, what: str) -> ModelError:
    """A ModelError naming the model, the op and what is wrong with it."""
    return ModelError(f"{model}: {what} (op {inp.f!r} with value {inp.value!r})")


# --------------------------------------------------------------------------- register, cas-register

_REG_OPS = ("read", "write")
_CAS_OPS = ("read", "write", "cas")


def _register_compile(name: str, allowed: tuple[str, ...]):
    """Compile steps for `register` / `cas-register` (state: the current value)."""

    def compile_(inp: Input, out: Output) -> Callable[[Any], Any] | None:
        f = inp.f
        if f not in allowed:
            raise _bad(name, inp, f"unknown f; expected one of {', '.join(allowed)}")
        if f == "read":
            if out.type != "ok":
                return None  # an unanswered read changes nothing
            v = out.value
            return lambda s: s if s == v else ILLEGAL
        if f == "write":
            v = inp.value
            return lambda s: v
        old, new = _cas_args(name, inp)
        # ok: it matched. info: if it happened, it matched (an unmatched cas is a no-op).
        return lambda s: new if s == old else ILLEGAL

    return compile_


def _cas_args(name: str, inp: Input) -> tuple[Any, Any]:
    """The `[old, new]` of a cas invoke, or a ModelError."""
    v = inp.value
    if not isinstance(v, tuple) or len(v) != 2:
        raise _bad(name, inp, "cas value must be [old, new]")
    return v[0], v[1]


def _register_read_only(inp: Input, out: Output) -> bool:
    """Reads, and a cas whose old and new are equal, never change a register."""
    if inp.f == "read":
        return True
    return inp.f == "cas" and isinstance(inp.value, tuple) and len(inp.value) == 2 and inp.value[0] == inp.value[1]


def prune_register(ops: list) -> list:
    """Drop `info` writes and cases whose written value nobody can observe (rule M1).

    Rule M1. Let W be an `info` op of a register that, if it takes effect, sets
    the value to v (`write v`, or `cas [old, v]`). Call an op an *observer* of
    v if it is an `ok` read returning v or a `cas` (ok or info) whose `old` is
    v. If no observer of v can be linearized after W -- every observer
    returned before W was invoked -- then W can be dropped.

    Proof. Dropping W only removes linearizations, so a history valid without
    W is valid with it (an info op need not be linearized). Conversely take a
    valid linearization that contains W, and let X be the ops between W and the
    next op N that changes the value (or the end). Each op in X ran in state v
    and is linearized after W, so it is not an observer of v: it is an
    `info`/`ok` cas with `old != v` or an `info` read, i.e. an op that did not
    change the state, or it is an `ok` read, which would return v and so be an
    observer -- impossible. N is not a successful cas (that needs `old == v`),
    so N is a write, whose effect does not depend on the state before it. Drop
    W and the `info` ops in X (info ops need not be linearized): every
    remaining op sees the same state as before, and the order is a
    subsequence of a real-time-respecting order, so it is a valid
    linearization without W. []
    """
    crashed = [op for op in ops if op.ret is None and op.input.f != "read"]
    if not crashed or _all_observed(ops, crashed):
        return ops
    return _prune_register_exact(ops, crashed)


def _prune_register_exact(ops: list, crashed: list) -> list:
    """`prune_register` by reading every op: each value's latest observer, then each crashed op judged."""
    inf = float("inf")
    # Observers as (value, return position), then one dict built in return order: the last entry per value,
    # its latest observer, wins (comprehensions and a C-level sort: this runs once per op of every partition).
    observers = [(op.output.value, op.ret) for op in ops if op.input.f == "read" and op.output.type == "ok"]
    observers += [(op.input.value[0], inf if op.ret is None else op.ret) for op in ops
                  if op.input.f == "cas" and op.input.value.__class__ is tuple and len(op.input.value) == 2]
    observers.sort(key=itemgetter(1))
    observed_until: dict[Any, float] = dict(observers)  # value -> latest return of an observer (inf: never)
    get = observed_until.get
    drop = set()
    for op in crashed:
        v = _written(op.input)
        if v is not _MALFORMED and get(v, -1) < op.call:  # a malformed op is kept: compile reports it
            drop.add(id(op))
    return [op for op in ops if id(op) not in drop] if drop else ops


_MALFORMED = object()


def _written(inp: Any) -> Any:
    """The value a crashed write or cas writes, or _MALFORMED for a cas whose value is not a pair."""
    if inp.f == "write":
        return inp.value
    if inp.value.__class__ is tuple and len(inp.value) == 2:
        return inp.value[1]
    return _MALFORMED


def _all_observed(ops: list, crashed: list) -> bool:
    """Whether every crashed op of `prune_register` has a witness: an observer of the value it writes that
    does not return before its call (so M1 keeps it, and nothing is dropped). Read from the end of `ops`,
    where a call-ordered partition's witnesses are, and stopped once every op has one: on most partitions
    a few dozen ops decide it, where the exact pass reads every op three times (False: that pass decides;
    a third of the register model's prepare on a 50-key history, bench/checker/run.py)."""
    need: dict[Any, int] = {}  # written value -> the latest call among the crashed ops writing it
    for op in crashed:
        v = _written(op.input)
        if v is _MALFORMED:
            continue  # kept, and compile reports it
        c = need.get(v)
        if c is None or c < op.call:
            need[v] = op.call
    if not need:
        return True
    get = need.get
    for op in reversed(ops):
        inp = op.input
        f = inp.f
        if f == "read":
            out = op.output
            if out.type != "ok":
                continue
            v = out.value
        elif f == "cas" and inp.value.__class__ is tuple and len(inp.value) == 2:
            v = inp.value[0]
        else:
            continue
        c = get(v)
        if c is not None and (op.ret is None or op.ret >= c):  # an info cas observes until +infinity
            del need[v]
            if not need:
                return True
    return False


def _describe_register_op(inp: Input, out: Output) -> str:
    """`read() -> v`, `write(v)`, `cas(old, new)`, with `?` for an unknown result."""
    if inp.f == "read":
        return f"read() -> {'?' if out.type == 'info' else _show(out.value)}"
    if inp.f == "write":
        return f"write({_show(inp.value)}){' ?' if out.type == 'info' else ''}"
    if isinstance(inp.value, tuple) and len(inp.value) == 2:
        return f"cas({_show(inp.value[0])}, {_show(inp.value[1])}) -> {'?' if out.type == 'info' else 'ok'}"
    return _default_describe_operation(inp, out)


def _show(v: Any) -> str:
    """A JSON-ish rendering of a value (`null` for None)."""
    return "null" if v is None else repr(v)


def _register_model(name: str, allowed: tuple[str, ...]) -> Model:
    """A register model (`register` or `cas-register`)."""
    compile_ = _register_compile(name, allowed)
    return Model(
        name=name,
        init=lambda: None,
        step=_step_from_compile(compile_),
        describe_operation=_describe_register_op,
        describe_state=_show,
        compile=compile_,
        read_only=_register_read_only,
        prune=prune_register,
        fs=frozenset(allowed),
    )


# --------------------------------------------------------------------------- mutex


def _mutex_compile(inp: Input, out: Output) -> Callable[[Any], Any]:
    """Compile `acquire` / `release` (state: whether the mutex is held)."""
    if inp.f == "acquire":
        return lambda s: ILLEGAL if s else True
    if inp.f == "release":
        return lambda s: False if s else ILLEGAL
    raise _bad("mutex", inp, "unknown f; expected acquire or release")


MUTEX = Model(
    name="mutex",
    init=lambda: False,
    step=_step_from_compile(_mutex_compile),
    describe_operation=lambda i, o: f"{i.f}(){' ?' if o.type == 'info' else ''}",
    describe_state=lambda s: "held" if s else "free",
    compile=_mutex_compile,
    fs=frozenset(("acquire", "release")),
)


# --------------------------------------------------------------------------- fenced-register


def _write_accepted(inp: Input, out: Output) -> bool:
    """Whether an ok fenced write reports acceptance (true/null/{"accepted": true})."""
    v = out.value
    if v is None or v is True:
        return True
    if v is False:
        return False
    if isinstance(v, dict) and isinstance(v.get("accepted"), bool):
        return v["accepted"]
    raise _bad("fenced-register", inp, f"write result must be true, false, null or {{accepted: bool}}, got {v!r}")


def _fenced_compile(inp: Input, out: Output) -> Callable[[Any], Any] | None:
    """Compile fenced `read` / `write` (state: (value, token) of the last accepted write)."""
    if inp.f == "write":
        arg = inp.value
        if not isinstance(arg, dict) or "token" not in arg or not _is_int(arg["token"]):
            raise _bad("fenced-register", inp, 'write value must be {"value": v, "token": <int>}')
        v, t = arg.get("value"), arg["token"]
        new = (v, t)
        if out.type == "info" or _write_accepted(inp, out):
            return lambda s: new if s[1] is None or t >= s[1] else ILLEGAL
        return lambda s: s if s[1] is not None and t < s[1] else ILLEGAL
    if inp.f == "read":
        if out.type != "ok":
            return None
        r = out.value
        if isinstance(r, dict) and "value" in r:
            if "token" in r:
                want = (r["value"], r["token"])
                return lambda s: s if s == want else ILLEGAL
            rv = r["value"]
        else:
            rv = r
        return lambda s: s if s[0] == rv else ILLEGAL
    raise _bad("fenced-register", inp, "unknown f; expected read or write")


def _fenced_read_only(inp: Input, out: Output) -> bool:
    """Reads and rejected writes never change a fenced register."""
    if inp.f == "read":
        return True
    v = out.value
    return inp.f == "write" and out.type == "ok" and (v is False or (isinstance(v, dict) and v.get("accepted") is False))


def _is_int(x: Any) -> bool:
    """An integer that is not a bool."""
    return isinstance(x, int) and not isinstance(x, bool)


FENCED_REGISTER = Model(
    name="fenced-register",
    init=lambda: (None, None),
    step=_step_from_compile(_fenced_compile),
    describe_state=lambda s: f"{_show(s[0])} @token {_show(s[1])}",
    compile=_fenced_compile,
    read_only=_fenced_read_only,
    fs=frozenset(("read", "write")),
)


# --------------------------------------------------------------------------- kv


def _kv_compile(inp: Input, out: Output) -> Callable[[Any], Any] | None:
    """Compile `get` / `put` / `append` on one key's string."""
    f = inp.f
    if f == "get":
        if out.type != "ok":
            return None
        v = "" if out.value is None else out.value
        return lambda s: s if s == v else ILLEGAL
    if f in ("put", "append"):
        v = inp.value
        if not isinstance(v, str):
            raise _bad("kv", inp, f"{f} value must be a string")
        return (lambda s: v) if f == "put" else (lambda s: s + v)
    raise _bad("kv", inp, "unknown f; expected get, put or append")


KV = Model(
    name="kv",
    init=lambda: "",
    step=_step_from_compile(_kv_compile),
    describe_state=repr,
    compile=_kv_compile,
    read_only=lambda i, o: i.f == "get",
    fs=frozenset(("get", "put", "append")),
)


# --------------------------------------------------------------------------- lease
#
# State: (lease_id, token, expires_at_ms, status, max_token, commit_high_water)
#   lease_id   None (never granted), the current lease's id, or PENDING: granted by
#              an acquire whose response was lost, id and token not yet known
#   status     None, "active", "released", "revoked", or "expired" (only once an inspect reported it
#              expired: expiry is otherwise judged with the ops' own backend times)
#   expires_at None when unknown (an unanswered renew may have moved it). For a
#              PENDING lease it is a lower bound: the expiry of the lease that
#              was live when the unseen grant happened (that grant needed it over).
#   max_token  the highest token allocated so far (tokens only increase, C5)
#   high_water the highest token a commit was accepted with (C26)
#
# Backend times (`_ms`) come from the ops' own values, never from the history's
# clock: the model assumes backend time does not go backwards along the
# linearization (C20: one authoritative backend clock).

PENDING = "<pending>"
_ACTIVE, _RELEASED, _REVOKED, _EXPIRED = "active", "released", "revoked", "expired"
# Ended by a backend failure's recovery (`lease_faults`): the identity's records may have been rolled back, so
# inspect may report any terminal record of a lease allocated so far (section 8: restored leases are invalid).
_ROLLED_BACK = "rolled back"
# the record states inspect may report (C6's `state`), and the model status each one needs
_INSPECT_STATES = {_ACTIVE: _ACTIVE, _RELEASED: _RELEASED, _REVOKED: _REVOKED, _EXPIRED: _EXPIRED}
_LEASE_REF_OPS = ("renew", "release", "force-release", "revoke", "commit")
INVALIDATE = "invalidate"  # added by `lease_faults`, never in a recorded history
# The operations of the lease model (what the lease and fenced-append workloads record of a lease).
LEASE_FS = frozenset(("acquire", "renew", "release", "force-release", "revoke", "inspect", "commit", "read"))
_ORPHAN = "__orphan__"  # set by prepare_lease on ops that refer to a lease no answered acquire returned


class _LeaseRef(NamedTuple):
    """The lease an op refers to: its id and fencing token."""

    lease_id: Any
    token: int


def _field(inp: Input, d: Any, name: str, *, required: bool = True) -> Any:
    """A field of a lease value dict, or a ModelError saying it is missing."""
    if isinstance(d, dict) and name in d:
        return d[name]
    if required:
        raise _bad("lease", inp, f"value needs {name!r}")
    return None


def _lease_ref(inp: Input, out: Output) -> _LeaseRef:
    """The lease an op acts on: from its ok value when it names one, else from its invoke value."""
    v = out.value
    src = v if out.type == "ok" and isinstance(v, dict) and "lease_id" in v else inp.value
    tok = _field(inp, src, "fencing_token")
    if not _is_int(tok):
        raise _bad("lease", inp, "fencing_token must be an integer")
    return _LeaseRef(_field(inp, src, "lease_id"), tok)


def _is_orphan(inp: Input) -> bool:
    """Whether `prepare_lease` marked this op as referring to a lease no answered acquire returned."""
    return isinstance(inp.value, dict) and bool(inp.value.get(_ORPHAN))


def _bind(s: tuple, ref: _LeaseRef, orphan: bool) -> tuple | None:
    """The state with `ref` as the current lease, or None when `ref` cannot be the current lease.

    A PENDING lease binds to an orphan lease id (one no answered acquire
    returned) whose token is above every token allocated before it; its expiry
    becomes unknown.
    """
    lid, tok, exp, st, mx, hw = s
    if lid == ref.lease_id:
        return s if tok == ref.token else None
    if lid is PENDING and orphan and (mx is None or ref.token > mx):
        return (ref.lease_id, ref.token, None, st, ref.token, hw)
    return None


def _sent_mismatch(f: str, out: Output) -> bool:
    """An ok renew / release / commit whose reply names another lease or token than the client sent.

    `value.sent` (docs/history-format.md) is what went on the wire; C12, C13 and C25 act on that exact
    lease or not at all, so such an op cannot be linearized anywhere.
    """
    v = out.value
    if out.type != "ok" or not isinstance(v, dict) or not isinstance(v.get("sent"), dict):
        return False
    sent = v["sent"]
    pairs = [("lease_id", "lease_id"), ("fencing_token", "fencing_token")]
    if f == "commit":
        pairs.append(("fencing_token", "accepted_token"))
    return any(sent.get(a) is not None and v.get(b) is not None and sent[a] != v[b] for a, b in pairs)


def _names_no_lease(v: Any) -> bool:
    """An op whose input names neither a lease id nor a token. The workloads record the lease a renew, release
    or commit named only in its completion (`value.sent`, merged into the input by the pairing), so an op
    that never completed (a crashed client, a run killed before the completion was written) names none."""
    return not isinstance(v, dict) or ("lease_id" not in v and "fencing_token" not in v)


def _lease_unnamed(f: str) -> Callable[[Any], Any]:
    """An unanswered renew / release / end / commit whose lease is unknown: it may have acted on the current
    lease, whatever it is, or on none.

    The real op named the lease its session held (one an answered op returned, never an unseen PENDING grant)
    or none at all; on a correct server it acted on that lease only if it was the current one. Letting it act
    on whichever lease is current covers every such effect, so the model never convicts a history for an op
    it cannot see (a false alarm); it is as permissive as an op can be, which only these rare ops are.
    """
    to = _REVOKED if f == "revoke" else _RELEASED

    def step(s: tuple) -> Any:
        lid, tok, exp, st, mx, hw = s
        if lid is None or lid is PENDING or st != _ACTIVE:
            return ILLEGAL  # no lease to act on: the op need not take effect
        if f == "renew":
            return (lid, tok, None, st, mx, hw)  # the expiry it set is unknown
        if f == "commit":
            return ILLEGAL if hw is not None and tok < hw else (lid, tok, exp, st, mx, tok)
        return (lid, tok, exp, to, mx, hw)

    return step


def _never(_state: Any) -> Any:
    """The step of an op that no state explains."""
    return ILLEGAL


def _lease_compile(inp: Input, out: Output) -> Callable[[Any], Any] | None:
    """Compile one lease op (the `_lease_*` builders below say what each one checks)."""
    f, ok = inp.f, out.type == "ok"
    if f in _LEASE_REF_OPS and _sent_mismatch(f, out):
        return _never
    if f in _LEASE_REF_OPS and not ok and _names_no_lease(inp.value):
        return _lease_unnamed(f)
    if f == "acquire":
        return _lease_acquire(inp, out) if ok else _lease_acquire_info
    if f == "renew":
        return _lease_renew(inp, out, ok)
    if f in ("release", "force-release", "revoke"):
        return _lease_end(inp, out, _REVOKED if f == "revoke" else _RELEASED)
    if f == "inspect":
        return _lease_inspect(inp, out) if ok else None
    if f == "commit":
        return _lease_commit(inp, out, ok)
    if f == "read":
        return _lease_read(inp, out) if ok else None
    if f == INVALIDATE:
        return _lease_invalidate
    raise _bad("lease", inp, "unknown f; expected acquire, renew, release, force-release, revoke, inspect, commit "
                             "or read")


def _lease_acquire(inp: Input, out: Output) -> Callable[[Any], Any]:
    """An answered acquire: legal iff no lease is live at its backend `acquired_at_ms` and its token is new.

    Live means status active with `expires_at_ms > acquired_at_ms` (an unknown
    expiry gets the benefit of the doubt). The token must exceed every token
    allocated before (C5, matrix row 4). An acquire returning the current lease
    (same id and token) is an idempotent replay and changes nothing.
    """
    r = out.value
    lid, tok = _field(inp, r, "lease_id"), _field(inp, r, "fencing_token")
    at, exp = _field(inp, r, "acquired_at_ms"), _field(inp, r, "expires_at_ms")
    if not (_is_int(tok) and _is_int(at) and _is_int(exp)):
        raise _bad("lease", inp, "fencing_token, acquired_at_ms and expires_at_ms must be integers")

    def step(s: tuple) -> Any:
        clid, ctok, cexp, st, mx, hw = s
        if clid == lid:
            return s if ctok == tok else ILLEGAL
        if st == _ACTIVE and cexp is not None and cexp > at:
            return ILLEGAL
        if mx is not None and tok <= mx:
            return ILLEGAL
        return (lid, tok, exp, _ACTIVE, tok, hw)

    return step


def _lease_acquire_info(s: tuple) -> Any:
    """An unanswered acquire may have granted a lease we never saw: the state becomes PENDING.

    The grant needed the live lease over, so that lease's expiry stays as a
    lower bound on when the unseen one is over. A second unseen grant on top of
    a PENDING one would leave the same state, so it is refused (a no-op).
    """
    clid, ctok, cexp, st, mx, hw = s
    if clid is PENDING and st == _ACTIVE:
        return ILLEGAL
    return (PENDING, None, cexp if st == _ACTIVE else None, _ACTIVE, mx, hw)


def _lease_renew(inp: Input, out: Output, ok: bool) -> Callable[[Any], Any]:
    """renew: legal iff the lease is current, active and unexpired at the renew's backend `renewed_at_ms`.

    An answered renew sets `expires_at_ms` to its reported value (which may be
    earlier than before: the contract caps it at acquired_at + maximum
    lifetime). An unanswered renew may have moved the expiry to an unknown time.
    """
    ref, orphan = _lease_ref(inp, out), _is_orphan(inp)
    at = _field(inp, out.value, "renewed_at_ms") if ok else None
    exp = _field(inp, out.value, "expires_at_ms") if ok else None

    def step(s: tuple) -> Any:
        b = _bind(s, ref, orphan)
        if b is None or b[3] != _ACTIVE:
            return ILLEGAL
        lid, tok, cexp, st, mx, hw = b
        if at is not None and cexp is not None and at >= cexp:
            return ILLEGAL  # renewed after expiry: an expired lease is never revived
        return (lid, tok, exp, st, mx, hw)  # exp is None for an unanswered renew: unknown

    return step


def _lease_end(inp: Input, out: Output, to: str) -> Callable[[Any], Any]:
    """release / force-release / revoke: legal iff the lease is current and active (or already ended so).

    The ok value carries no time of the release itself, so expiry is not judged
    here. A repeat on a lease already ended the same way is an idempotent replay.
    """
    ref, orphan = _lease_ref(inp, out), _is_orphan(inp)

    def step(s: tuple) -> Any:
        b = _bind(s, ref, orphan)
        if b is None:
            return ILLEGAL
        lid, tok, exp, st, mx, hw = b
        if st == _ACTIVE:
            return (lid, tok, exp, to, mx, hw)
        return b if st == to else ILLEGAL

    return step


def _lease_inspect(inp: Input, out: Output) -> Callable[[Any], Any] | None:
    """inspect: the record reported must be what the lease is at that point, terminal states included.

    The contract keeps a lease's terminal record (section 3: "terminal evidence
    kept") and inspect returns the record with its `state`:

    - `active` (or no `state`): the current lease, active.
    - `released` / `revoked`: the current lease, ended that way (force-release
      ends a lease as released).
    - `expired`: the current lease, not ended; expiry is judged by backend time
      the op does not carry, so it is believed, and from then on the lease is
      expired for every op (C10): no renew, release or commit of it succeeds.
    - an inspect by `lease_id` may also report a superseded lease, whose record
      is then terminal (one lease per identity is ever active) and whose token
      was allocated before.
    - after a backend failure ended the current lease (`lease_faults`: the
      records may have been rolled back to a snapshot), any inspect may report
      the terminal record (released, revoked or expired) of the current lease
      or of a lease allocated before: the restore rule makes every restored
      lease invalid, and which record the rollback kept is not in the history.

    `null` carries no backend time, so the model cannot tell an expired lease
    from a live one and accepts it (the op is dropped).
    """
    r = out.value
    if r is None:
        return None
    ref = _LeaseRef(_field(inp, r, "lease_id"), _field(inp, r, "fencing_token"))
    reported = r.get("state") if isinstance(r, dict) else None
    reported = _ACTIVE if reported is None else reported
    if reported not in _INSPECT_STATES:
        raise _bad("lease", inp, f"inspect state must be one of {', '.join(_INSPECT_STATES)}, got {reported!r}")
    orphan = _is_orphan(inp)
    by_id = isinstance(inp.value, dict) and inp.value.get("lease_id") is not None
    ended = _INSPECT_STATES[reported]

    def step(s: tuple) -> Any:
        b = _bind(s, ref, orphan)
        if b is None:  # not the current lease: only an inspect by id may see a superseded lease's terminal record
            mx = s[4]  # (or any inspect once a rollback may have brought an older record back)
            ok = ((by_id or s[3] == _ROLLED_BACK) and reported != _ACTIVE and s[0] != ref.lease_id and mx is not None
                  and ref.token <= mx)
            return s if ok else ILLEGAL
        lid, tok, exp, st, mx, hw = b
        if st == _ROLLED_BACK:  # ended by the recovery: any terminal record, the state unchanged
            return b if reported != _ACTIVE else ILLEGAL
        if reported == _EXPIRED:
            return (lid, tok, exp, _EXPIRED, mx, hw) if st in (_ACTIVE, _EXPIRED) else ILLEGAL
        return b if st == ended else ILLEGAL

    return step


def _lease_commit(inp: Input, out: Output, ok: bool) -> Callable[[Any], Any]:
    """commit, the fenced write (C24-C29).

    Legal iff the lease is current and active, unexpired at the commit's backend
    `validated_at_ms` (C25), and its token is not below the high-water mark of
    accepted tokens (C26); the mark becomes the token. An unanswered commit may
    have been accepted under the same conditions (time unknown).
    """
    ref, orphan = _lease_ref(inp, out), _is_orphan(inp)
    at = _field(inp, out.value, "validated_at_ms", required=False) if ok else None
    t = ref.token

    def step(s: tuple) -> Any:
        b = _bind(s, ref, orphan)
        if b is None or b[3] != _ACTIVE:
            return ILLEGAL
        lid, tok, exp, st, mx, hw = b
        if at is not None and exp is not None and at >= exp:
            return ILLEGAL
        if hw is not None and t < hw:
            return ILLEGAL
        return (lid, tok, exp, st, mx, t)

    return step


def _lease_read(inp: Input, out: Output) -> Callable[[Any], Any] | None:
    """The final read of the fenced document: its `token` must be the commit high-water mark."""
    r = out.value
    if not isinstance(r, dict) or "token" not in r:
        return None
    want = r["token"]
    return lambda s: s if s[5] == want else ILLEGAL


def _lease_invalidate(s: tuple) -> Any:
    """A backend failure's recovery may end the current lease (see `lease_faults`): it is then rolled back,
    ended for every op (no renew, release or commit of it succeeds), and inspect may report any terminal record
    of it or of an earlier lease (the rollback may have restored one)."""
    lid, tok, exp, st, mx, hw = s
    if lid is None or st == _ROLLED_BACK:
        return ILLEGAL  # nothing to end: the op need not take effect
    return (lid, tok, exp, _ROLLED_BACK, mx, hw)


# Faults after which the backend's lease records may be lost or rolled back (value.fault of the nemesis op;
# `kill` only when it killed Valkey).
BACKEND_LOSS = frozenset(("valkey-crash", "valkey-restore"))


def lease_faults(history: list[dict]) -> list[dict]:
    """At each fault that may lose or roll back the backend's records, one unanswered `invalidate` per key.

    The contract's races table (backup / restore, failover) lets the service recover by moving to a
    higher epoch with "all restored leases invalid": after such a fault the current lease of each
    identity may end without any client op. The added op is invoked when the fault starts and never
    completes, so the search may let it take effect once, at any later point, or never; everything
    else (tokens only increase, one live lease at a time before and after it) is judged as usual.

    Each added op's value is `{"loss": [begin, end]}`: the positions, in the returned history, of the
    fault's invocation and of the record after which the loss has surely happened (a restore's end, a
    crash's or kill's start). `prepare_lease` reads it to tell a replay the loss answered afresh (rule L1).
    """
    points = [pos for pos, op in enumerate(history) if _loses_backend(op)]
    if not points:
        return history
    keys = sorted({op.get("key") for op in history if op.get("process") != "nemesis" and op.get("key") is not None},
                  key=str)
    # Each added op gets a client process id of its own, above every one in the history (the pairing
    # accepts integer client processes only, and a process never invokes twice without completing).
    procs = [p for op in history if (p := op.get("process")).__class__ is int]
    next_proc = max(procs, default=-1) + 1

    def moved(p: int) -> int:  # a position of `history` in the returned one: len(keys) ops follow each point
        return p + len(keys) * bisect.bisect_left(points, p)

    out = list(history)
    for pos in reversed(points):
        op = history[pos]
        begin, end = _loss_span(history, pos)
        loss = FrozenDict(loss=(moved(begin), moved(end) if end is not None else _NEVER))
        extra = [{"index": op.get("index", pos), "time": op.get("time", 0), "type": "invoke", "f": INVALIDATE,
                  "process": next_proc + i, "key": k, "value": loss} for i, k in enumerate(keys)]
        next_proc += len(keys)
        out[pos + 1:pos + 1] = extra
    return out


_NEVER = float("inf")  # a loss whose end is not in the history (a restore still running when it ended)


def _loss_span(history: list[dict], pos: int) -> tuple[int, int | None]:
    """Where the loss started at `pos` began (the fault's invocation, the last nemesis record with its `f` and
    no phase) and where it has surely happened: a restore rolls back at its end (the next record of that fault
    with another phase; None if there is none), a crash or kill at its start (`pos` itself)."""
    op = history[pos]
    begin = pos
    for q in range(pos - 1, -1, -1):
        prev = history[q]
        if prev.get("process") == "nemesis" and prev.get("f") == op.get("f"):
            if not isinstance(prev.get("value"), dict) or "phase" not in prev["value"]:
                begin = q
            break
    fault = op["value"].get("fault")
    if fault != "valkey-restore":
        return begin, pos
    for q in range(pos + 1, len(history)):
        v = history[q].get("value")
        if (history[q].get("process") == "nemesis" and isinstance(v, dict) and v.get("fault") == fault
                and v.get("phase") not in (None, "start")):
            return begin, q
    return begin, None


def _loses_backend(op: dict) -> bool:
    """A nemesis op that started a fault losing or rolling back the backend's records."""
    v = op.get("value")
    if op.get("process") != "nemesis" or not isinstance(v, dict) or v.get("phase") != "start":
        return False
    fault = v.get("fault")
    return fault in BACKEND_LOSS or (fault == "kill" and "valkey" in (v.get("targets") or ()))


def _lease_read_only(inp: Input, out: Output) -> bool:
    """read and (non-binding) inspect never change the state when legal (an inspect reporting expiry does)."""
    if inp.f == "read":
        return True
    reported = out.value.get("state") if isinstance(out.value, dict) else None
    return inp.f == "inspect" and not _is_orphan(inp) and reported != _EXPIRED


def merge_retries(ops: list, request_id: Callable[[Any], Any],
                  apart: Callable[[Any, Any], bool] | None = None) -> list:
    """Merge attempts of one logical op (same `f` and non-None request id) into one op.

    The merged op is invoked with the first attempt and returns with the first
    `ok` attempt (with its output), or is indeterminate if none was answered.
    `apart(a, b)`, when given, says that `b` (a later attempt) is a new logical op
    although it repeats `a`'s request id (`a` answered ok before it): `b` and the
    attempts after it are merged as their own op.
    See `prepare_lease` (rule L1) for why this is sound. Merged ops are built with the ops' own class
    (`checkers.linear.history.Op`), which this module cannot import: the engine imports the models.
    """
    groups: dict[tuple[str, Any], list[Any]] = {}
    for op in ops:
        rid = request_id(op)
        if rid is not None:
            try:
                groups.setdefault((op.input.f, rid), []).append(op)
            except TypeError:
                continue
    drop: set[int] = set()
    added: list[Any] = []
    for group in groups.values():
        if len(group) < 2:
            continue
        for part in _logical_ops(sorted(group, key=lambda o: o.call), apart):
            if len(part) < 2:
                continue
            first = part[0]
            answered = [o for o in part if o.ret is not None]
            ok = min(answered, key=lambda o: o.ret) if answered else None
            merged = type(first)(first.index, first.process, first.f, first.key, first.input,
                                 ok.output if ok else Output("info", None), first.call, ok.ret if ok else None)
            merged.merged = tuple(sorted(o.index for o in part))
            drop.update(id(o) for o in part)
            added.append(merged)
    if not drop:
        return ops
    return sorted([o for o in ops if id(o) not in drop] + added, key=lambda o: o.call)


def _logical_ops(attempts: list, apart: Callable[[Any, Any], bool] | None) -> list[list]:
    """Attempts of one request id (in call order) cut where `apart` says an attempt is a new logical op."""
    if apart is None:
        return [attempts]
    parts: list[list] = [[]]
    for op in attempts:
        answer = next((o for o in parts[-1] if o.ret is not None and o.output.type == "ok"), None)
        if answer is not None and apart(answer, op):
            parts.append([])
        parts[-1].append(op)
    return parts


def prepare_lease(ops: list) -> list:
    """Merge idempotent retries and mark references to unseen leases (rules L1, L2a).

    Rule L1 (retries). Ops with the same `f` and `request_id` are one logical
    operation (C17): the backend performs it at most once and every answered
    attempt reports that one result. The merged op is invoked with the first
    attempt and returns with the first `ok` attempt, with that attempt's result
    (`info` if no attempt was answered). The real effect lies inside that
    interval (the first attempt was sent before it, the first ok answer came
    after it), so nothing linearizable is lost. Later answers are not compared
    here (that is the idempotency checker's job).

    Rule L2a (unseen grants). Lease ids that no answered acquire returned are
    "orphans": they can only come from an acquire whose answer was lost. Ops
    referring to one are marked, and only they may bind a PENDING lease.

    Rule L1 does not hold across a backend loss (`lease_faults`): the restored
    backend may have lost the record of an answered attempt, and the contract's
    restore row lets it answer a later attempt as a new request in a higher epoch.
    So an ok attempt whose result names another lease, token or document than an
    earlier ok answer of its request id, with a loss between them (begun before
    the later attempt returned, ended after the earlier one was invoked), is a new
    logical op (the idempotency checker excuses such a pair too).
    """
    losses = [op.input.value["loss"] for op in ops if op.input.f == INVALIDATE and isinstance(op.input.value, dict)]
    ops = merge_retries(ops, _request_id, _answered_afresh(losses) if losses else None)
    granted = {op.output.value.get("lease_id") for op in ops
               if op.input.f == "acquire" and op.output.type == "ok" and isinstance(op.output.value, dict)}
    for op in ops:
        f, out = op.input.f, op.output
        if f in _LEASE_REF_OPS or (f == "inspect" and isinstance(out.value, dict)):
            src = out.value if isinstance(out.value, dict) and "lease_id" in out.value else op.input.value
            if isinstance(src, dict) and "lease_id" in src and src["lease_id"] not in granted:
                op.input = Input(f, FrozenDict({**(op.input.value or {}), _ORPHAN: True}))
    return ops


def _answered_afresh(losses: list) -> Callable[[Any, Any], bool]:
    """`apart` for `merge_retries`: whether `b` answered its request afresh after a loss lost `a`'s record."""

    def apart(a: Any, b: Any) -> bool:
        if b.ret is None or b.output.type != "ok":
            return False
        if replay_outcome(a.f, a.output.value) == replay_outcome(b.f, b.output.value):
            return False
        return any(begin < b.ret and end > a.call for begin, end in losses)

    return apart


def replay_outcome(f: str, value: Any) -> tuple:
    """What a replay of an answered op must repeat: a commit's document, revision and accepted token; any other
    op's lease and token (the idempotency checker judges replays by the same tuple)."""
    r = value if isinstance(value, dict) else {}
    if f == "commit":
        return (r.get("doc"), r.get("rev"), r.get("accepted_token"))
    return (r.get("lease_id"), r.get("fencing_token"))


def prune_lease(ops: list) -> list:
    """Drop unanswered acquires that no orphan reference can follow (rule L2b).

    An unanswered acquire A that no orphan-referring op can follow (all of them
    returned before A was invoked) is dropped. Proof: in a valid linearization
    where A took effect from state S0 to S_A = (PENDING, -, bound, active, max,
    hw), the ops run in S_A up to the next change are (i) reads, which look at
    `hw` only, equal in S0 and S_A, and (ii) an answered acquire G. Nothing else
    is legal on an unbound PENDING lease (renew, release, commit and inspect
    need the id, and no orphan reference follows A; a second unseen grant is
    refused). G is legal in S_A iff `bound <= G.acquired_at` and its token
    exceeds `max`; `bound` is S0's expiry when S0 was active, so that is G's
    condition in S0 too, and G leaves the same state either way. (A replay of
    S0's lease has a token <= max, illegal in both; the one difference is a G
    that reports S0's lease id with a new token, a C7 violation that only the
    pruned history reports.) So removing A leaves a valid linearization; and a
    history valid without A is valid with it (info ops need not be linearized).
    """
    orphan_until = -1.0  # latest return position of an orphan-referring op (inf: never returns)
    for op in ops:
        if _is_orphan(op.input):
            orphan_until = max(orphan_until, float("inf") if op.ret is None else op.ret)
    return [op for op in ops if not (op.input.f == "acquire" and op.output.type == "info" and orphan_until < op.call)]


def _request_id(op: Any) -> Any:
    """The request_id of a lease op's invoke value, or None."""
    v = op.input.value
    return v.get("request_id") if isinstance(v, dict) else None


def _describe_lease_state(s: tuple) -> str:
    """`lease L token T active until E (max token M, commit high-water H)`."""
    lid, tok, exp, st, mx, hw = s
    head = "no lease" if lid is None else f"lease {lid} token {_show(tok)} {st} until {_show(exp)}"
    return f"{head} (max token {_show(mx)}, commit high-water {_show(hw)})"


LEASE = Model(
    name="lease",
    init=lambda: (None, None, None, None, None, None),
    step=_step_from_compile(_lease_compile),
    describe_state=_describe_lease_state,
    compile=_lease_compile,
    read_only=_lease_read_only,
    prepare=prepare_lease,
    prune=prune_lease,
    faults=lease_faults,
    fs=LEASE_FS,
)

# --------------------------------------------------------------------------- registry

MODELS: dict[str, Model] = {
    "register": _register_model("register", _REG_OPS),
    "cas-register": _register_model("cas-register", _CAS_OPS),
    "mutex": MUTEX,
    "fenced-register": FENCED_REGISTER,
    "lease": LEASE,
    "kv": KV,
}


def unmodelled_fs(model: Model, history: list[dict]) -> list[str]:
    """The `f`s of the history's client invocations that `model` does not model (sorted; [] when it declares no
    `fs`). Invocations only: a completion whose `f` differs from its invocation's is a malformed history, which the
    pairing reports as such (the same HistoryError in every checker)."""
    if model.fs is None:
        return []
    return sorted({str(op.get("f")) for op in history
                   if op.get("process") != "nemesis" and op.get("type") == "invoke"} - model.fs)


def models_taking(fs: Collection[str]) -> list[str]:
    """The registered models that model every one of `fs`."""
    return [name for name, m in MODELS.items() if m.fs is not None and set(fs) <= m.fs]


def get_model(name: str) -> Model:
    """The model registered as `name`; a ValueError lists the known names otherwise."""
    try:
        return MODELS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(MODELS)}") from None

