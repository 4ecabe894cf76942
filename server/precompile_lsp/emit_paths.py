"""Where each target's emit writes, and whether it may: the artifact path a target's
``artifact=`` (or the workspace's artifact-dir) names, the pair paths beside it, which
other targets write the same paths (neither may then be emitted), and the write
refusals that do not depend on the files there (outside the workspace, a pair that
collides with itself). Whether the files there are ours is the write policy's call
(``staleness.artifact_status``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from precompile.write_policy import pair_collision, pair_paths
from precompile_lsp.config import Config
from precompile_lsp.discovery import TargetDecl
from precompile_lsp.files import shown_path
from precompile_lsp.staleness import artifact_status

if TYPE_CHECKING:
    from precompile_lsp.engine_records import TargetState


def in_resolved_folder(path: Path) -> Path:
    """``path`` with its folder resolved, so a symlinked folder counts where it leads (out
    of the workspace, say), and its own name kept: a symbolic link at the file itself is
    then what the write policy examines, and it never writes through one. Resolving the
    whole path handed the policy the link's destination instead -- absent (a new module
    inside the sources) or an older artifact the link points at -- and the emit wrote
    there."""
    return path.parent.resolve() / path.name


class EmitPaths:
    """The emit paths of an engine's targets (``targets`` is the engine's own dict, read
    live). Call ``reconfigured`` when the configuration changes and ``invalidate`` when
    targets come or go: the index of who writes where is rebuilt only then, since asking
    for every target must not cost targets squared."""

    def __init__(self, root: Path, config: Config, targets: Mapping[str, TargetState]) -> None:
        self.root = root
        self.config = config
        self.targets = targets
        #: Every path a target's emit writes (artifact, cache, signature) -> the targets
        #: that write it, with what each writes there.
        self._by_path: dict[Path, list[tuple[TargetDecl, str]]] | None = None

    def reconfigured(self, config: Config) -> None:
        self.config = config
        self.invalidate()

    def invalidate(self) -> None:
        self._by_path = None

    def artifact_of(self, decl: TargetDecl) -> tuple[Path, bool]:
        declared = decl.options.get("artifact")
        if isinstance(declared, str):
            # Like every path of the workspace's configuration: relative to its root.
            return in_resolved_folder(self.root / declared), True
        return in_resolved_folder(self.config.default_artifact(decl.module, decl.function)), False

    def written_paths(self, decl: TargetDecl) -> list[tuple[Path, str]]:
        """Every path an emit of ``decl`` writes or removes, with its kind: the artifact,
        its ``.cache`` and its ``.sig`` (``in_resolved_folder``). Temporaries and backups
        are random siblings created exclusively."""
        artifact, _ = self.artifact_of(decl)
        return [(in_resolved_folder(Path(p)), kind) for p, kind in pair_paths(str(artifact))]

    def _index(self) -> dict[Path, list[tuple[TargetDecl, str]]]:
        """Each written path -> the targets that write it (rebuilt when targets or the
        configuration change: asking for every target must not cost targets squared)."""
        if self._by_path is None:
            index: dict[Path, list[tuple[TargetDecl, str]]] = {}
            for key in sorted(self.targets):
                declared = self.targets[key].decl
                for path, kind in self.written_paths(declared):
                    index.setdefault(path, []).append((declared, kind))
            self._by_path = index
        return self._by_path

    def shared_paths(
        self, decl: TargetDecl
    ) -> list[tuple[TargetDecl, list[tuple[Path, str, str]]]]:
        """Each other target that writes one of ``decl``'s paths, with every path they
        share: ``(path, what decl writes there, what the other writes there)``."""
        index: dict[str, tuple[TargetDecl, list[tuple[Path, str, str]]]] = {}
        for path, kind in self.written_paths(decl):
            for other, other_kind in self._index().get(path, []):
                if other.key == decl.key:
                    continue
                paths = index.setdefault(other.key, (other, []))[1]
                if paths and paths[0][1:] == ("artifact", "artifact"):
                    continue  # one artifact path: its .cache and .sig go without saying
                if all(path != p for p, _, _ in paths):
                    paths.append((path, kind, other_kind))
        return list(index.values())

    def conflicts(self, decl: TargetDecl) -> list[TargetDecl]:
        """Other targets whose emit writes one of the paths ``decl``'s emit writes (the
        artifact, or its ``.cache`` or ``.sig``): neither may be emitted."""
        return [other for other, _ in self.shared_paths(decl)]

    def write_refusal(self, decl: TargetDecl) -> str | None:
        """Why an emit of ``decl`` may not write where its artifact= points, by where the
        path is: outside the workspace (``../``, an absolute path, a symlinked folder that
        leads out) unless it is the artifact-dir the workspace's [tool.precompile] names;
        or a path that is its own cache or signature path. Whether the files there are
        ours is the write policy's call (``ArtifactStatus.refused``)."""
        artifact, _ = self.artifact_of(decl)
        allowed = [self.root, self.config.artifact_dir.resolve()]
        shown = shown_path(artifact, self.root)
        for path, _kind in self.written_paths(decl):
            if not any(path == a or a in path.parents for a in allowed):
                return (
                    f"{shown_path(path, self.root)} is outside the workspace {self.root}; "
                    f"the tools write only inside it (or into the artifact-dir that "
                    f"[tool.precompile] names)"
                )
        collision = pair_collision(str(artifact))
        if collision is not None:
            return collision.replace(str(artifact), shown)
        return None

    def emit_refusal(self, decl: TargetDecl) -> str | None:
        """Why an emit of ``decl`` may not write at all (reads files: off the loop)."""
        refused = self.write_refusal(decl)
        if refused is not None:
            return refused
        artifact, _ = self.artifact_of(decl)
        return artifact_status(artifact, self.root).refused

    def conflict_text(self, decl: TargetDecl) -> str:
        shared = "; ".join(
            f"{o.key} writes {shown_path(path, self.root)} too (as its {theirs})"
            for o, paths in self.shared_paths(decl)
            for path, _, theirs in paths
        )
        return (
            f"{decl.key} was not written: {shared}; so neither overwrites the other. Give "
            f"each target its own artifact= path"
        )
