"""Library-module values the trace read whose other values cannot change what the graph
computes (issue 26, "what the graph depends on, not what the trace touched").

A module's ``inplace`` flag and an embedding's ``padding_idx`` are read by the traced
forward, so a read-recorder counts them as dependencies. But which value they hold
changes only *how* eager computes, not *what*: ``relu_(h)`` and ``relu(h)`` give the same
values unless ``h`` is read again; ``padding_idx`` only masks a gradient. Whether that
holds is a property of the graph, so the capture proves it per read, from the graph, and
drops the read where the proof holds; where it does not, the read stays checked and the
refusal says why (``MODULE_READ_NOTES``).

``RULES`` is the one table of such values: a new member of the class is a row, not a new
code path. Each row says which kind of proof applies:

- ``in_place``: the flag chooses between an operator and its in-place form. Harmless iff
  the operator's input is a tensor the graph itself made (not fn's input, a parameter or
  a buffer: a tensor the caller sees), made by an operator whose result aliases nothing
  (not a view, not an in-place result), and read by nothing after the operator (no later
  operator, no output, no backward).
- ``in_place_in_eval``: the flag of a module that is the identity when not training
  (Dropout): harmless iff the module was in eval at capture; its ``training`` flag was
  read, so a call in training is refused anyway.
- ``backward_only``: an operator argument that only its backward uses (``aten.embedding``'s
  ``padding_idx``, ``scale_grad_by_freq``, ``sparse``): harmless iff the artifact holds no
  backward (an inference capture, served with outputs that carry no grad). A training
  artifact baked the value into its backward and keeps the check.

The operator is the first one the trace recorded after the value was read (the module's
forward reads its attributes, then calls the operator): a make_fx graph names it as an
ATen operator (``ops``), a Dynamo graph as a torch function (``functions``). Anything
else found there -- another operator, a decomposition, no operator -- proves nothing, and
the read stays checked.
"""

from __future__ import annotations

import dataclasses
import operator
import re
from typing import Any

from precompile._compat import tracing
from precompile.locations import is_user_file
from precompile.runtime.value_fingerprints import PURE_TRUTH_TYPES

IN_PLACE = "in_place"
IN_PLACE_IN_EVAL = "in_place_in_eval"
BACKWARD_ONLY = "backward_only"


@dataclasses.dataclass(frozen=True)
class Rule:
    """How one library module's attribute can be shown not to change the graph's values."""

    kind: str
    #: ATen operators (overload packet names) the forward calls with the value (make_fx).
    ops: tuple[str, ...] = ()
    #: torch functions (``__name__``) the forward calls with the value (Dynamo's graph).
    functions: tuple[str, ...] = ()


def _in_place(*ops: str, functions: tuple[str, ...] = ()) -> Rule:
    return Rule(IN_PLACE, ops=ops, functions=functions or ops[:1])


_ACT = "torch.nn.modules.activation."
_DROP = "torch.nn.modules.dropout."
_SPARSE = "torch.nn.modules.sparse."

#: (module class, attribute) -> its rule. A subclass that keeps the class's ``forward``
#: inherits the row; one with its own forward does not (its forward may use the value
#: otherwise).
RULES: dict[tuple[str, str], Rule] = {
    (_ACT + "ReLU", "inplace"): _in_place("relu"),
    (_ACT + "ReLU6", "inplace"): _in_place("hardtanh", "relu6", functions=("relu6", "hardtanh")),
    (_ACT + "Hardtanh", "inplace"): _in_place("hardtanh"),
    (_ACT + "LeakyReLU", "inplace"): _in_place("leaky_relu"),
    (_ACT + "ELU", "inplace"): _in_place("elu"),
    (_ACT + "SELU", "inplace"): _in_place("elu", "selu", functions=("selu",)),
    (_ACT + "CELU", "inplace"): _in_place("elu", "celu", functions=("celu",)),
    (_ACT + "SiLU", "inplace"): _in_place("silu"),
    (_ACT + "Mish", "inplace"): _in_place("mish"),
    (_ACT + "Hardswish", "inplace"): _in_place("hardswish"),
    (_ACT + "Hardsigmoid", "inplace"): _in_place("hardsigmoid"),
    (_ACT + "Threshold", "inplace"): _in_place("threshold"),
    (_ACT + "RReLU", "inplace"): _in_place("rrelu_with_noise", functions=("rrelu",)),
    **{
        (_DROP + name, "inplace"): Rule(IN_PLACE_IN_EVAL, functions=(function,))
        for name, function in (
            ("Dropout", "dropout"),
            ("Dropout1d", "dropout1d"),
            ("Dropout2d", "dropout2d"),
            ("Dropout3d", "dropout3d"),
            ("AlphaDropout", "alpha_dropout"),
            ("FeatureAlphaDropout", "feature_alpha_dropout"),
        )
    },
    **{
        (_SPARSE + "Embedding", name): Rule(
            BACKWARD_ONLY, ops=("embedding",), functions=("embedding",)
        )
        for name in ("padding_idx", "scale_grad_by_freq", "sparse")
    },
}

#: Every attribute name some rule covers: what the read recorder notes the position of.
NAMES = frozenset(name for _, name in RULES)


def rule_for(module: Any, name: str) -> Rule | None:
    """The rule for ``name`` read on ``module``: that of the first class in its MRO with
    a row, if ``module``'s class runs that class's own ``forward``."""
    return class_rule(type(module), name)


def class_rule(kind: type, name: str) -> Rule | None:
    """``rule_for`` by the module's class."""
    for cls in kind.__mro__:
        rule = RULES.get((f"{cls.__module__}.{cls.__qualname__}", name))
        if rule is not None:
            return rule if getattr(kind, "forward", None) is getattr(cls, "forward", None) else None
    return None


def _op_name(node: Any) -> str | None:
    packet = getattr(node.target, "overloadpacket", None)
    return getattr(packet, "__name__", None)


def _aliases(node: Any) -> bool:
    """Whether an ATen node's result is a view or an in-place result of an argument
    (an item of a multi-result operator, ``batch_norm``'s output: that operator's)."""
    if node.target is operator.getitem:
        return getattr(node.args[0], "op", None) != "call_function" or _aliases(node.args[0])
    aliases = tracing.op_result_aliases(node.target)
    return aliases is not False  # not an ATen operator: nothing says it aliases nothing


def prove_in_graph(
    graph: Any, after: Any, rule: Rule, name: str, *, training: bool, inference: bool
) -> str | None:
    """None where the graph proves that other values of ``name`` compute the same
    values; else why not, in words a refusal can show. ``after`` is the graph's last
    node when the value was read (the operator that used it comes next)."""
    if rule.kind == IN_PLACE_IN_EVAL:
        if not training:
            return None
        return (
            "the module was in training at capture, where its in-place form overwrites "
            "its input; the graph baked the out-of-place one"
        )
    if rule.kind == BACKWARD_ONLY and not inference:
        return (
            f"{name} shapes the gradient, and this artifact holds a backward that baked "
            f"it (a training capture, or parameters or inputs that require grad)"
        )
    nodes = list(graph.nodes)
    try:
        start = nodes.index(after) + 1 if after is not None else 0
    except ValueError:
        return "the capture cannot find where the trace used it in the graph"
    op = next((n for n in nodes[start:] if n.op == "call_function"), None)
    found = None if op is None else _op_name(op)
    if found not in rule.ops:
        wanted = " or ".join(f"aten.{o}" for o in rule.ops)
        got = f"aten.{found}" if found else "no ATen operator"
        return (
            f"the trace used it in {got}, not {wanted} (a decomposed or replaced "
            f"forward); the capture cannot show the graph's values do not depend on it"
        )
    if rule.kind == BACKWARD_ONLY:
        return None
    return _in_place_harmless(nodes, op, str(found))


def _in_place_harmless(
    nodes: list[Any], op: Any, opname: str, aliases: Any = _aliases
) -> str | None:
    """Whether ``op`` run in place on its input changes nothing anything else sees."""
    source = op.args[0] if op.args else None
    if getattr(source, "op", None) == "placeholder":
        return (
            f"{opname}'s input comes from outside the graph (one of fn's inputs, a "
            f"parameter or a buffer, or a value carried across a graph break): in-place "
            f"{opname} changes a tensor the caller or later code may read"
        )
    if source is None or getattr(source, "op", None) != "call_function" or aliases(source):
        return (
            f"{opname}'s input is a view or an in-place result of another tensor: "
            f"in-place {opname} changes that tensor too"
        )
    position = {n: i for i, n in enumerate(nodes)}
    for user in source.users:
        if user is op or position[user] < position[op]:
            continue
        if user.op == "output":
            return (
                f"{opname}'s input is also returned by fn: in-place {opname} changes "
                f"what eager returns"
            )
        return (
            f"{opname}'s input is read again after it ({user.name}): in-place {opname} "
            f"changes eager's result"
        )
    return None


def _forward_codes(kind: type) -> frozenset[Any]:
    """The code of the library ``forward`` a module of ``kind`` runs: the only reader of
    a ruled value whose use the graph shows (other code may branch on it)."""
    forward = getattr(kind, "forward", None)
    code = getattr(forward, "__code__", None)
    return frozenset() if code is None else frozenset({code})


def _read_elsewhere(reader: Any, name: str) -> str:
    where = getattr(reader, "co_qualname", None) or getattr(reader, "co_name", "unknown code")
    file = str(getattr(reader, "co_filename", "")).rsplit("/", 1)[-1]
    return (
        f"{where} ({file}) reads {name} too, outside the module's forward: what it does "
        f"with the value is baked in the graph"
    )


def settle_fx_reads(
    graph: Any,
    modules: list[Any],
    reads: dict[int, set[str] | None],
    positions: dict[tuple[int, str], list[tuple[Any, Any]]],
    *,
    inference: bool,
) -> list[list[Any]]:
    """A make_fx capture's ruled reads: each one the graph proves harmless (at every
    place the trace read it) leaves ``reads``, so the artifact accepts any value of it;
    the others stay, and are returned as ``MODULE_READ_NOTES`` rows ``[module argument
    index, submodule path, attribute, why]`` for the refusal to say why."""
    notes: list[list[Any]] = []
    for mi, m in enumerate(modules):
        for path, sub in m.named_modules():
            seen = reads.get(id(sub))
            if not seen:
                continue
            for name in sorted(seen & NAMES):
                rule = rule_for(sub, name)
                if rule is None:
                    continue
                why = None
                library = _forward_codes(type(sub))
                for after, reader in positions.get((id(sub), name), [(None, None)]):
                    if reader not in library:
                        why = _read_elsewhere(reader, name)
                    else:
                        why = prove_in_graph(
                            graph, after, rule, name, training=sub.training, inference=inference
                        )
                    if why is not None:
                        break
                if why is None:
                    seen.discard(name)
                else:
                    notes.append([mi, path, name, why])
    return notes


def _torch_level_aliases(node: Any) -> bool:
    """Whether a Dynamo graph node's result may share memory with another tensor: a
    view (its example value says so) or an in-place method or function (``add_``)."""
    view = tracing.is_view(node.meta.get("example_value"))
    target = getattr(node.target, "__name__", str(node.target))
    return view is not False or target.endswith("_")


def _module_path(source_name: str) -> str:
    """A Dynamo source's name as ``nn_module_stack`` spells the module's path:
    ``L['model']._modules['act']`` is ``L['model'].act``."""
    return re.sub(r"\._modules\['([^']+)'\]", r".\1", source_name)


def prove_dynamo_guard(
    graph: Any, module_source: str, name: str, readers: list[tuple[type, Any]]
) -> str | None:
    """None where a Dynamo frame's graph proves that other values of the module
    attribute ``module_source.name`` (a constant Dynamo guards) compute the same values;
    else why not. The module's first operator is the first node of the graph traced
    inside it (``nn_module_stack``), named as a torch function. ``readers``: the
    (module class, code) of each traced read; each must be the library's forward."""
    if not readers:
        return "the capture did not see which code read it"
    for kind, reader in readers:
        if reader not in _forward_codes(kind):
            return _read_elsewhere(reader, name)
    path = _module_path(module_source)
    nodes = list(graph.nodes)
    inside = []
    for node in nodes:
        stack = node.meta.get("nn_module_stack") or {}
        if node.op == "call_function" and stack:
            innermost = list(stack.values())[-1]
            if innermost[0] == path:
                inside.append((node, innermost[1]))
    if not inside:
        return "the capture cannot find where the trace used it in the graph"
    op, kind = inside[0]
    rule = class_rule(kind, name) if isinstance(kind, type) else None
    if rule is None:
        return "no rule shows its value harmless here"
    if rule.kind == IN_PLACE_IN_EVAL:
        # F.dropout(input, p, training, inplace): the identity either way in eval.
        training = op.kwargs.get("training", op.args[2] if len(op.args) > 2 else True)
        if getattr(op.target, "__name__", None) in rule.functions and training is False:
            return None
        return (
            "the module was in training at capture, where its in-place form overwrites "
            "its input; the graph baked the out-of-place one"
        )
    if rule.kind == BACKWARD_ONLY:
        grads = any(
            getattr(n.meta.get("example_value"), "requires_grad", False)
            for n in nodes
            if n.op == "call_function"
        )
        if grads:
            return f"{name} shapes the gradient, and this graph computes values that require grad"
    found = getattr(op.target, "__name__", None)
    if found not in rule.functions:
        return f"the trace used it in {found}, not {' or '.join(rule.functions)}"
    if rule.kind == BACKWARD_ONLY:
        return None
    return _in_place_harmless(nodes, op, str(found), _torch_level_aliases)


# -- Flags that only matter when the module trains ---------------------------------------
#
# ``if self.gradient_checkpointing and self.training and ...:`` reads the flag first, so
# the trace records the flag (and, with the flag False, never reads ``training``). Yet with
# ``training`` False the condition is False for every value of the flag: the flag decides
# nothing. Whether a read has that shape is a property of the reading code, proved from
# its bytecode for every place it reads the name; the dependency then moves from the flag
# to the module's ``training`` flag, which the artifact checks per call (a call in training
# is refused, naming it). No attribute is named here: any flag read this way is covered.

#: Instructions that carry no meaning for the pattern (inline caches, no-ops, 3.13's
#: explicit truth test before a conditional jump).
_FILLER = frozenset({"CACHE", "NOP", "EXTENDED_ARG", "TO_BOOL"})
_JUMP_IF_FALSE = frozenset(
    {"POP_JUMP_IF_FALSE", "POP_JUMP_FORWARD_IF_FALSE", "POP_JUMP_BACKWARD_IF_FALSE"}
)
_JUMP_IF_TRUE = frozenset(
    {"POP_JUMP_IF_TRUE", "POP_JUMP_FORWARD_IF_TRUE", "POP_JUMP_BACKWARD_IF_TRUE"}
)
_CONDITIONAL = _JUMP_IF_FALSE | _JUMP_IF_TRUE
_LOAD_ATTRS = frozenset({"LOAD_ATTR", "LOAD_METHOD"})


def _attr_name(ins: Any) -> str | None:
    """The attribute a ``LOAD_ATTR`` loads (3.12 packs a method flag into its argval)."""
    if ins.opname not in _LOAD_ATTRS:
        return None
    value = ins.argval
    return value if isinstance(value, str) else None


def _training_guarded_at(ins: list[Any], i: int, owner: str) -> bool:
    """Whether ``ins[i]`` is a conditional jump on the flag's truth whose other outcome
    tests ``owner.training`` next, and whether, with ``training`` False, that test leads
    where the flag's jump leads: then both values of the flag reach the same instruction
    with the same stack (both jumps pop what they test). ``if flag and training:``,
    ``if not flag and training:``, ``if flag and training or other:`` and a conditional
    expression all have this shape; a value kept (``y = flag and training``) does not."""
    if i >= len(ins) or ins[i].opname not in _CONDITIONAL:
        return False
    rest = ins[i + 1 : i + 4]
    if not (
        len(rest) == 3
        and rest[0].opname == "LOAD_FAST"
        and rest[0].argval == owner
        and _attr_name(rest[1]) == "training"
        and rest[2].opname in _CONDITIONAL
    ):
        return False
    if rest[2].opname in _JUMP_IF_FALSE:
        when_not_training = rest[2].argval
    elif i + 4 < len(ins):
        when_not_training = ins[i + 4].offset
    else:
        return False
    return bool(when_not_training == ins[i].argval)


def read_only_under_training(code: Any, name: str) -> bool:
    """Whether every read of the attribute ``name`` in ``code`` is tested at once by a
    condition whose other operand is ``x.training`` (``x.name and x.training``,
    ``not x.name and x.training``, ``x.name and x.training or other``; ``getattr(x,
    "name", default)`` alike) on one of ``code``'s own arguments ``x`` that it never
    rebinds, where with ``x.training`` False both values of the flag reach the same
    instruction (``_training_guarded_at``). Any other use of the name -- a branch on it
    alone, ``x.name or x.training``, a value kept (``y = x.name and ...``), the name as a
    string anywhere else -- proves nothing."""
    return training_only_sites(code, name) is not None


#: Where in its source an instruction is: (line, end line, column, end column).
Site = tuple[Any, ...]


def training_only_sites(code: Any, name: str) -> frozenset[Site] | None:
    """The source positions in ``code`` of its reads of ``name`` where
    ``read_only_under_training`` holds (the ``LOAD_ATTR``, or the ``PRECALL``/``CALL``
    of ``getattr(x, "name")``), or None where it does not. A read observed at run time
    is proved only at one of these sites: the same code may also read the flag where its
    text does not name it (``getattr(self, computed)``), which decides in eval. Source
    positions, not offsets: Dynamo renumbers the instructions it traces."""
    if not isinstance(code, type(read_only_under_training.__code__)):
        return None
    return _training_only_sites(code, name)


def _training_only_sites(code: Any, name: str) -> frozenset[Site] | None:
    import dis

    ins = [i for i in dis.get_instructions(code) if i.opname not in _FILLER]
    arguments = set(code.co_varnames[: code.co_argcount + code.co_kwonlyargcount])
    rebound = {i.argval for i in ins if i.opname in ("STORE_FAST", "DELETE_FAST")}
    sites: set[Site] = set()
    for k, one in enumerate(ins):
        if _attr_name(one) == name:
            owner = ins[k - 1].argval if k and ins[k - 1].opname == "LOAD_FAST" else None
            after = k + 1
            at = [one.positions]
        elif one.opname == "LOAD_CONST" and one.argval == name:
            # getattr(x, "name") or getattr(x, "name", default), called at once.
            owner = ins[k - 1].argval if k and ins[k - 1].opname == "LOAD_FAST" else None
            j = k + 1
            if j < len(ins) and ins[j].opname == "LOAD_CONST":
                j += 1
            first_call = j
            while j < len(ins) and ins[j].opname == "PRECALL":
                j += 1
            if not (
                k >= 2
                and ins[k - 2].opname == "LOAD_GLOBAL"
                and ins[k - 2].argval == "getattr"
                and j < len(ins)
                and ins[j].opname == "CALL"
            ):
                return None
            after = j + 1
            at = [i.positions for i in ins[first_call : j + 1]]
        else:
            continue
        if not isinstance(owner, str) or owner not in arguments or owner in rebound:
            return None
        if not _training_guarded_at(ins, after, owner):
            return None
        sites.update(tuple(p) for p in at if p is not None and p[0] is not None)
    return frozenset(sites) if sites else None


_UNDER_TRAINING: dict[tuple[Any, str], frozenset[Site] | None] = {}


def read_only_under_training_cached(code: Any, name: str, at: Any) -> bool:
    """Whether a read of ``name`` made by ``code`` at source position ``at`` (a
    ``dis.Positions``) is one ``read_only_under_training`` proves
    (``training_only_sites``, once per code and name per capture process); a read at an
    unknown position proves nothing."""
    key = (code, name)
    if key not in _UNDER_TRAINING:
        _UNDER_TRAINING[key] = training_only_sites(code, name)
    sites = _UNDER_TRAINING[key]
    return sites is not None and at is not None and tuple(at) in sites


def position_at(code: Any, offset: int) -> Site | None:
    """The source position of the instruction at byte ``offset`` of ``code`` (a frame's
    ``f_lasti``), or None where the code has none."""
    positions = list(code.co_positions())
    return positions[offset // 2] if 0 <= offset // 2 < len(positions) else None


def forwarded_attribute(code: Any) -> str | None:
    """The attribute ``name`` where ``code`` does nothing but ``return self.name`` on its
    one argument (a property's getter ``def flag(self): return self.mode``): its value
    is the attribute's, so a truth test of it is a truth test of the attribute."""
    import dis

    if not isinstance(code, type(forwarded_attribute.__code__)) or code.co_argcount != 1:
        return None
    if code.co_flags & 0x0C or code.co_kwonlyargcount:  # *args, **kwargs
        return None
    ins = [i for i in dis.get_instructions(code) if i.opname not in _FILLER | {"RESUME"}]
    if (
        len(ins) == 3
        and ins[0].opname == "LOAD_FAST"
        and ins[0].argval == code.co_varnames[0]
        and ins[2].opname == "RETURN_VALUE"
    ):
        return _attr_name(ins[1])
    return None


def _forwarding_properties(cls: type, code: Any, name: str) -> list[str]:
    """Every property name of ``cls`` (as its MRO resolves them) whose getter is
    ``code``, where ``code`` only returns ``self.name`` (``forwarded_attribute``)."""
    if forwarded_attribute(code) != name:
        return []
    seen: set[str] = set()
    found = []
    for klass in cls.__mro__:
        for key, value in vars(klass).items():
            if key in seen:
                continue
            seen.add(key)
            fget = getattr(value, "fget", None) if type(value) is property else None
            if getattr(fget, "__code__", None) is code:
                found.append(key)
    return found


def forwarded_truth(cls: type, code: Any, name: str, codes: list[Any]) -> list[str]:
    """Dynamo's form of the property rule of ``settle_training_only_reads``: the
    properties of ``cls`` whose getter ``code`` only returns ``self.name``, where no
    user code among ``codes`` (those Dynamo traced) names ``fget`` or ``__get__`` or
    reads one of those properties other than as ``x.prop and x.training``; else none
    (the read of ``name`` proves nothing)."""
    props = _forwarding_properties(cls, code, name)
    user = [c for c in codes if is_user_file(getattr(c, "co_filename", ""))]
    if not props or any(
        _names_attribute(c, "fget") or _names_attribute(c, "__get__") for c in user
    ):
        return []
    if any(
        _names_attribute(c, p) and training_only_sites(c, p) is None for c in user for p in props
    ):
        return []
    return props


def settle_training_only_reads(
    modules: list[Any],
    reads: dict[int, set[str] | None],
    readers: dict[tuple[int, str], set[Any]],
    codes: Any = (),
) -> dict[int, dict[str, bool]]:
    """A make_fx capture's reads of flags that only matter in training: on a submodule
    in eval at capture, a name every reader of which reads it only as ``x.name and
    x.training`` (``read_only_under_training``) leaves ``reads`` and ``training`` joins
    them, so the artifact checks the training flag (``MODULE_TRAINING``) per call
    instead of the flag's value. ``readers``: the code of each read, by (submodule id,
    name).

    Eager still runs the flag's truth test before it reads ``training``, so the flag
    stays checked by the kind of its value: returned by submodule id, the names read
    only for their truth test (``MODULE_READS`` writes them ``[TRUTH_ONLY, name]``;
    ``value_fingerprints.truth_kind``): any value of a ``PURE_TRUTH_TYPES`` type is
    served, another type refused. A flag that held another type at capture keeps its
    value checked (its truth test ran in the trace, and may have done anything). Each
    name comes with whether the submodule or a class of its MRO held it (a deletion of
    it is refused then: eager's plain read raises; one absent was read by ``getattr``
    with a default).

    A name read only by a property's getter that just returns it (``flag`` a property
    ``return self.mode``: ``forwarded_attribute``) settles with the property: where
    the property settled on that submodule and every code the trace ran (``codes``)
    that names the property reads it only as ``x.flag and x.training`` (no
    ``type(self).flag.fget(self)`` that would read ``mode`` for its value), ``mode``'s
    value reaches only that truth test, so it is read only for its truth test too."""
    truths: dict[int, dict[str, bool]] = {}
    codes = list(codes)
    # A getter run other than by reading its property (``P.fget(self)``,
    # ``P.__get__(self)``) would read the attribute for its value.
    getters_called = any(
        _names_attribute(c, "fget") or _names_attribute(c, "__get__") for c in codes
    )
    for m in modules:
        for sub in m.modules():
            seen = reads.get(id(sub))
            if not seen or sub.training:
                continue
            state = vars(sub)
            settled = truths.get(id(sub), {})

            def forwarded(code: Any, name: str, sub: Any = sub, settled: Any = settled) -> bool:
                props = _forwarding_properties(type(sub), code, name)
                return (
                    bool(props)
                    and not getters_called
                    and all(
                        p in settled
                        and not any(
                            _names_attribute(c, p) and training_only_sites(c, p) is None
                            for c in codes
                        )
                        for p in props
                    )
                )

            # Properties before the names their getters forward (a property forwarding
            # to another property settles only in name order; else it stays checked by
            # value, which is safe).
            properties = _properties(sub)
            for name in sorted(seen - {"training"}, key=lambda n: (n not in properties, n)):
                if name in state and type(state[name]) not in PURE_TRUTH_TYPES:
                    continue
                if name not in state and any(
                    name in vars(sub).get(d, ()) for d in ("_parameters", "_buffers", "_modules")
                ):
                    continue  # a tensor or a module: its truth test reads its data
                read_by = readers.get((id(sub), name))
                if read_by and all(
                    read_only_under_training_cached(c, name, position_at(c, at))
                    or forwarded(c, name)
                    for c, at in read_by
                ):
                    seen.discard(name)
                    seen.add("training")
                    held = name in state or any(name in vars(c) for c in type(sub).__mro__)
                    settled[name] = held
                    truths[id(sub)] = settled
    return truths


def _properties(module: Any) -> set[str]:
    """The names that are properties along ``module``'s class MRO."""
    return {k for c in type(module).__mro__ for k, v in vars(c).items() if type(v) is property}


def _names_attribute(code: Any, name: str) -> bool:
    """Whether ``code`` (or a code nested in it) names ``name`` as an attribute, a
    global or a string constant: where it could read a class attribute of that name."""
    if name in code.co_names or name in code.co_consts:
        return True
    return any(_names_attribute(c, name) for c in code.co_consts if isinstance(c, type(code)))


def class_truth_names(
    modules: list[Any],
    reads: dict[int, set[str] | None],
    truths: dict[int, dict[str, bool]],
    codes: Any,
    outside: set[type] | None = None,
) -> dict[Any, frozenset[str]]:
    """Per submodule class, the class-level flags the trace read only for their truth
    test: a name ``settle_training_only_reads`` settled on an instance that does not
    hold it (``x.flag and x.training`` reads the class's ``flag``), so the class record
    compares it by ``truth_kind`` as the instance record compares one the instance
    holds (``class_fingerprints.CLASS_TRUTH``), and a flag set on the class is served.

    Only where no other read can see the class's value: every instance of the class
    among the submodules read it only for its truth test or not at all (its reads
    seen), the value held at capture is of a ``PURE_TRUTH_TYPES`` type, and every code
    the trace ran that names it (``codes``: ``Net.flag``, ``type(self).flag``,
    ``getattr(self, "flag")``) reads it only as ``x.flag and x.training`` on an
    argument (``training_only_sites``), and no module outside the submodules whose
    class has it along its MRO had an attribute read (``outside``: a global module's
    reads are not recorded, and it may be in training; None, unknown, relaxes nothing)."""
    if outside is None:
        return {}
    excluded = {c for cls in outside for c in cls.__mro__}
    found: dict[Any, set[str]] = {}
    ruled_out: set[tuple[Any, str | None]] = set()
    for m in modules:
        for sub in m.modules():
            cls = type(sub)
            seen = reads.get(id(sub))
            if seen is None:
                ruled_out.add((cls, None))
                continue
            ruled_out.update((cls, name) for name in seen)
            for name in truths.get(id(sub), {}):
                if name not in vars(sub) and any(name in vars(c) for c in cls.__mro__):
                    found.setdefault(cls, set()).add(name)
    codes = list(codes)
    result: dict[Any, frozenset[str]] = {}
    for cls, names in found.items():
        keep = set()
        for name in names:
            if (cls, None) in ruled_out or (cls, name) in ruled_out:
                continue
            holder = next(c for c in cls.__mro__ if name in vars(c))
            if holder in excluded:
                continue
            if type(vars(holder)[name]) not in PURE_TRUTH_TYPES:
                continue
            if any(
                _names_attribute(code, name) and training_only_sites(code, name) is None
                for code in codes
            ):
                continue
            keep.add(name)
        if keep:
            result[cls] = frozenset(keep)
    return result
