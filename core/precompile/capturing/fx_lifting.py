"""Invariant 1 at capture: every param and buffer of the module arguments is an input.

The runtime driver re-derives the same list from the live modules on every call
(``runtime.single_graph_model_state.lift_live_module_state``); the two must order and name tensors identically, which
a test asserts.
"""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass
class LiftedState:
    """The module arguments' tensors in graph-input order: params, then buffers.

    ``aliases[k]`` lists every (module index, qualified name) under which tensor ``k``
    is reachable, so a tied weight is lifted once and swapped in under all its names.
    """

    tensors: list[torch.Tensor]
    names: list[str]
    aliases: list[list[tuple[int, str]]]
    num_params: int
    #: Several module arguments: names carry an ``m{i}.`` prefix.
    multi: bool = False

    def tied_names(self) -> list[list[str]]:
        """Each tensor reachable under more than one name (a tied weight), as all its
        names, the lifted one first then in walk order (``STATE_ALIASES``): which names
        share a tensor is what the graph baked (it reads one input for all of them), so
        the runtime checks that the same names share it, in whatever walk order."""
        return [
            [self.qualified(mi, name) for mi, name in names]
            for names in self.aliases
            if len(names) > 1
        ]

    def qualified(self, module_index: int, name: str) -> str:
        """``name`` of module argument ``module_index`` as the artifact names it."""
        return f"m{module_index}.{name}" if self.multi else name

    @property
    def params(self) -> list[torch.Tensor]:
        return self.tensors[: self.num_params]

    @property
    def buffers(self) -> list[torch.Tensor]:
        return self.tensors[self.num_params :]


def lift_module_state(modules: list[torch.nn.Module]) -> LiftedState:
    multi = len(modules) > 1
    index: dict[int, int] = {}
    state = LiftedState([], [], [], 0, multi)
    for kind in ("named_parameters", "named_buffers"):
        for mi, module in enumerate(modules):
            for name, tensor in getattr(module, kind)(remove_duplicate=False):
                k = index.get(id(tensor))
                if k is None:
                    k = index[id(tensor)] = len(state.tensors)
                    state.tensors.append(tensor)
                    state.names.append(state.qualified(mi, name))
                    state.aliases.append([])
                state.aliases[k].append((mi, name))
        if kind == "named_parameters":
            state.num_params = len(state.tensors)
    return state


def module_training_flags(module: torch.nn.Module) -> list[tuple[str, bool]]:
    """Each submodule's training flag: make_fx bakes it (dropout, batch-norm mode)."""
    return [(name, bool(sub.training)) for name, sub in module.named_modules()]
