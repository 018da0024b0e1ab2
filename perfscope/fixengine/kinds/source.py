"""Source fixes: patch a file of the server's code, in its sglang install (found from the server's
interpreter, ``--sglang-root``) or named by ``--target-file``."""

from __future__ import annotations

from typing import Optional

from perfscope.errors import InputError
from perfscope.fixengine.host import FixHost, join
from perfscope.fixengine.kinds.base import FixKind
from perfscope.fixengine.model import AlreadyApplied, Detection, Environment, FixModule, Outcome, TargetSpec
from perfscope.fixengine.request import FixRequest
from perfscope.fixengine.state import created_path


class SourceKind(FixKind):
    name = "source"
    target_option = "--target-file"
    changes = "code"
    needs_server_code = True

    def check_request(self, fix: FixModule, req: FixRequest, action: Optional[str]) -> None:
        if req.launch_file:
            raise InputError(
                f"{fix.id} patches the server's source, not its launch command: --launch-file does not apply"
            )

    def resolve_target(
        self, fix: FixModule, host: FixHost, env: Environment, req: FixRequest, reverting: bool = False
    ) -> tuple[TargetSpec, str, bytes]:
        if req.target_file:
            path = req.target_file
            data = host.pin(path)
            for_file = getattr(fix, "target_for_file", None)
            if req.target:
                spec = fix.target_for(env, req.target)
            elif for_file is not None:
                spec = for_file(data)
            else:
                spec = fix.target_for(env, None)
            return spec, path, data
        try:
            spec = fix.target_for(env, req.target)
        except KeyError:
            names = ", ".join(t.name for t in fix.targets)
            raise InputError(f"--target {req.target}: unknown (this fix knows {names})") from None
        if not spec.relpath:
            made = created_path(host, req, fix, env) if reverting and spec.creates else None
            if made is not None:  # the server is gone, but the install says what this fix created in it
                return spec, made, (host.pin(made) if host.exists(made) else b"")
            if spec.creates and spec.description:  # a file the fix names from facts it could not read
                raise InputError(f"{fix.id}: cannot name the file to write: {spec.description}")
            raise InputError(f"target {spec.name} has no place in an sglang install: give --target-file")
        if not env.sglang_root:
            where = f" with {env.python}" if env.python else ""
            raise InputError(
                f"sglang not found{where} on {host.label}: give --python (the server's interpreter), "
                "--sglang-root DIR or --target-file F"
            )
        path = join(host, env.sglang_root, *spec.relpath.split("/"))
        if spec.creates and not host.exists(path):
            return spec, path, b""  # a file the fix creates: absent is its original state
        return spec, path, host.pin(path)

    def patched_without_manifest(self, fix: FixModule, det: Detection, path: str, folder: str) -> Outcome:
        return AlreadyApplied(
            f"{path} carries the patch, but no manifest is in {folder}: perfscope cannot restore "
            "the original (reinstall sglang to undo)"
        )
