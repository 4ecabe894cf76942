"""What the editor asks of the targets in a file: code actions (re-emit a stale
artifact, emit or verify the target under the cursor), code lenses, hovers on findings,
the emit / verify / recheck commands with their progress, and the engines' statistics.
``register`` wires them onto the server; ``server`` holds the server's state and the
document lifecycle."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from lsprotocol import types

from precompile_lsp.engine import Engine
from precompile_lsp.files import shown_path
from precompile_lsp.lsp_convert import hover_markdown, lens_title, path_of, to_range, uri_of
from precompile_lsp.protocol import JobResult, Outcome
from precompile_lsp.server_state import PrecompileServer
from precompile_lsp.serving_logs import lens_text
from precompile_lsp.stages import stage_percentage, stage_text


def register(server: PrecompileServer) -> None:
    """Answer these requests on ``server`` (called once, where the server is made)."""
    server.feature(
        types.TEXT_DOCUMENT_CODE_ACTION,
        types.CodeActionOptions(
            code_action_kinds=[types.CodeActionKind.QuickFix, types.CodeActionKind.Source]
        ),
    )(on_code_action)
    server.feature(types.TEXT_DOCUMENT_CODE_LENS)(on_code_lens)
    server.feature(types.TEXT_DOCUMENT_HOVER)(on_hover)
    server.command("precompile.emit")(cmd_emit)
    server.command("precompile.verify")(cmd_verify)
    server.command("precompile.recheck")(cmd_recheck)
    server.feature("precompile/stats")(on_stats)


def target_at(ls: PrecompileServer, uri: str, line: int, named: list[str]) -> Any | None:
    """The target whose function (decorator to last line) holds ``line`` (0-based),
    else the first of ``named`` (targets the diagnostics under the cursor belong to)."""
    path = path_of(uri)
    engine = ls.engine_for(path)
    if engine is None:
        return None
    path = path.resolve()
    for state in engine.targets.values():
        decl = state.decl
        last = max(decl.end_line, decl.definition.line)
        if decl.file == path and decl.decorator.line - 1 <= line <= last - 1:
            return decl
    return next((engine.targets[k].decl for k in named if k in engine.targets), None)


async def run_command(ls: PrecompileServer, name: str, uri: str, key: str) -> str:
    """Emit or verify one target for the editor, with cancellable work-done progress
    (where the client supports it) and a message saying how it went."""
    if not ls.trusted:
        ls.tell_untrusted()
        return "Precompile: not trusted; nothing was run"
    path = path_of(uri)
    engine = ls.engine_for(path)
    if engine is None:
        return f"Precompile: {uri} is not in a workspace folder"
    state = engine.targets.get(key)
    if state is None:
        await engine.discover_async([path])
        state = engine.targets.get(key)
    if state is None:
        return f"Precompile: no target {key} in {path.name}"
    kind = "emit" if name == "precompile.emit" else "verify"
    token = str(uuid.uuid4())
    progress = ls.supports_progress()
    task = asyncio.current_task()
    if progress:
        await ls.work_done_progress.create_async(token)
        future = ls.work_done_progress.tokens.get(token)
        if future is not None and task is not None:
            future.add_done_callback(lambda f: task.cancel() if f.cancelled() else None)
        ls.work_done_progress.begin(
            token,
            types.WorkDoneProgressBegin(
                title=f"Precompile: {kind} {state.decl.function}",
                cancellable=True,
                message="starting",
                percentage=0,
            ),
        )

        def on_stage(event: dict[str, Any]) -> None:
            ls.work_done_progress.report(
                token,
                types.WorkDoneProgressReport(
                    message=stage_text(event), percentage=stage_percentage(event)
                ),
            )

        ls.stage_listeners[(state.decl.key, kind)] = on_stage
    try:
        if kind == "verify":
            result = await engine.verify(state.decl)
        else:
            result = await engine.emit(state.decl)
        if progress:
            ls.work_done_progress.report(
                token,
                types.WorkDoneProgressReport(message="refreshing findings", percentage=98),
            )
        ls.publish()
        if ls.running == 0:
            ls.status("idle")  # the findings count may have changed
        message = command_message(kind, state.decl, result, engine)
    except asyncio.CancelledError:
        message = f"Precompile: {kind} of {state.decl.function} cancelled"
    finally:
        ls.stage_listeners.pop((state.decl.key, kind), None)
    if progress:
        ls.work_done_progress.end(token, types.WorkDoneProgressEnd(message=message))
        ls.work_done_progress.tokens.pop(token, None)  # pygls keeps every token otherwise
    ls.window_show_message(types.ShowMessageParams(types.MessageType.Info, message))
    return message


def command_message(kind: str, decl: Any, result: JobResult, engine: Engine) -> str:
    if result.status is Outcome.CANCELLED:
        return f"Precompile: {kind} of {decl.function} was superseded by a newer run"
    if result.status.failed:
        return f"Precompile: {kind} of {decl.function} failed: {result.message}"
    if result.failure is not None:
        return f"Precompile: {kind} of {decl.function} failed: {result.failure.message}"
    if kind == "emit":
        artifact, _ = engine.emit_paths.artifact_of(decl)
        return f"Precompile: emitted {shown_path(artifact, engine.root)}"
    failures = result.verify_failures
    state = engine.targets.get(decl.key)
    stale = bool(state and state.artifact and state.artifact.stale)
    if failures or stale:
        problems = [f"{len(failures)} failure{'s' * (len(failures) != 1)}"] if failures else []
        if stale:
            problems.append("stale: its sources changed since it was emitted")
        return f"Precompile: {decl.function}'s artifact failed verification ({'; '.join(problems)})"
    return f"Precompile: {decl.function}'s artifact verified against eager"


def on_code_action(ls: PrecompileServer, params: types.CodeActionParams) -> list[types.CodeAction]:
    if not ls.trusted:
        return []
    uri = params.text_document.uri
    only = params.context.only
    actions: list[types.CodeAction] = []

    def wanted(kind: str) -> bool:
        return not only or any(kind.startswith(o) for o in only)

    named = []
    for diagnostic in params.context.diagnostics:
        data = diagnostic.data if isinstance(diagnostic.data, dict) else {}
        if not data.get("target"):
            continue
        named.append(data["target"])
        if data.get("fix") == "emit" and wanted(types.CodeActionKind.QuickFix):
            actions.append(
                types.CodeAction(
                    title="Re-emit precompile artifact",
                    kind=types.CodeActionKind.QuickFix,
                    diagnostics=[diagnostic],
                    is_preferred=True,
                    command=types.Command(
                        title="Re-emit precompile artifact",
                        command="precompile.emit",
                        arguments=[uri, data["target"]],
                    ),
                )
            )
    decl = target_at(ls, uri, params.range.start.line, named)
    if decl is not None and wanted(types.CodeActionKind.Source):
        for title, command in (
            ("Emit precompile artifact", "precompile.emit"),
            ("Verify artifact", "precompile.verify"),
        ):
            actions.append(
                types.CodeAction(
                    title=title,
                    kind=types.CodeActionKind.Source + ".precompile",
                    command=types.Command(
                        title=title, command=command, arguments=[uri_of(decl.file), decl.key]
                    ),
                )
            )
    return actions


def on_code_lens(ls: PrecompileServer, params: types.CodeLensParams) -> list[types.CodeLens]:
    if not ls.settings.code_lens:
        return []
    path = path_of(params.text_document.uri).resolve()
    engine = ls.engine_for(path)
    if engine is None:
        return []
    lines = ls.placement().lines
    lenses = []
    for state in engine.targets.values():
        if state.decl.file != path:
            continue
        where = to_range(state.decl.decorator, lines.of(path), ls.workspace.position_codec)
        uri = uri_of(path)
        if not ls.trusted:
            title = "precompile: not run (workspace not trusted)"
        else:
            title = lens_title(state.result, rechecking=engine.running(state.decl))
        production = engine.production.current.get(state.decl.key) if engine.production else None
        if production is not None:
            title = f"{title} · {lens_text(production)}"
        lenses.append(types.CodeLens(range=where, command=types.Command(title=title, command="")))
        if ls.trusted:
            lenses.append(
                types.CodeLens(
                    range=where,
                    command=types.Command(
                        title="Emit", command="precompile.emit", arguments=[uri, state.decl.key]
                    ),
                )
            )
            lenses.append(
                types.CodeLens(
                    range=where,
                    command=types.Command(
                        title="Verify", command="precompile.verify", arguments=[uri, state.decl.key]
                    ),
                )
            )
    return lenses


def on_hover(ls: PrecompileServer, params: types.HoverParams) -> types.Hover | None:
    line = params.position.line + 1
    for finding in ls.visible(params.text_document.uri):
        if (
            finding.code in ("PC101", "PC201", "PC103", "PC202", "PC001")
            and finding.span.line <= line <= finding.span.end_line
        ):
            return types.Hover(
                contents=types.MarkupContent(
                    kind=types.MarkupKind.Markdown, value=hover_markdown(finding)
                )
            )
    return None


async def cmd_emit(ls: PrecompileServer, uri: str, key: str) -> str:
    return await run_command(ls, "precompile.emit", uri, key)


async def cmd_verify(ls: PrecompileServer, uri: str, key: str) -> str:
    return await run_command(ls, "precompile.verify", uri, key)


async def cmd_recheck(ls: PrecompileServer, *args: Any) -> str:
    if not ls.trusted:
        ls.tell_untrusted()
        return "Precompile: not trusted; nothing was run"
    for engine in ls.engines.values():
        await ls.check(engine)
    return "Precompile: workspace rechecked"


def on_stats(ls: PrecompileServer, params: Any) -> list[dict[str, Any]]:
    """What each engine has done so far: jobs handed to workers, captures, cache hits,
    re-check batches. For a client's status view, and for telling that the server is
    quiet when nothing changes."""
    return [
        {
            "root": str(root),
            "jobs": engine.stats.jobs,
            "captures": engine.stats.captures,
            "cacheHits": engine.stats.cache_hits,
            "emits": engine.stats.emits,
            "verifies": engine.stats.verifies,
            "rechecks": engine.stats.rechecks,
            "targets": len(engine.targets),
        }
        for root, engine in ls.engines.items()
    ]
