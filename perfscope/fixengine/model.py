"""The fix engine's types: what a fix module declares, what a check finds, how an action ends.

A fix module is a folder ``fixes/<id_with_underscores>/`` whose ``__init__.py`` defines ``FIX``, an
instance of a :class:`FixModule` subclass: metadata (id, title, the finding ids it answers, the
targets it knows with their version ranges and strategies, requirements), a fixed document
(``README.md`` beside it), and per target: variant detection, the transformation for each strategy,
post-conditions. Revert is the engine's job (byte-exact restore from a verified backup).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Optional


# ----------------------------------------------------------------------------------- outcomes


@dataclass
class Outcome:
    """How an action ended. ``kind`` is one of the subclass names in kebab case."""

    reason: str = ""
    details: dict = field(default_factory=dict)
    kind = "outcome"
    ok = True

    def to_dict(self) -> dict:
        return {"outcome": self.kind, "ok": self.ok, "reason": self.reason, **self.details}


@dataclass
class Applied(Outcome):
    kind = "applied"


@dataclass
class Reverted(Outcome):
    kind = "reverted"


@dataclass
class AlreadyApplied(Outcome):
    kind = "already-applied"


@dataclass
class Checked(Outcome):
    """A check (dry run): the patch can be applied; nothing was changed."""

    kind = "checked"


@dataclass
class Skipped(Outcome):
    """Nothing to do here (e.g. no FP8 KV cache: there is no cast to remove)."""

    kind = "skipped"


@dataclass
class Refused(Outcome):
    """Must not be applied here (unknown variant, wrong GPU, file changed since the check)."""

    kind = "refused"
    ok = False


@dataclass
class Failed(Outcome):
    """Tried and failed (patched file did not compile, server unhealthy after restart...)."""

    kind = "failed"
    ok = False


# -------------------------------------------------------------------------------- environment


def parse_version(v: str | None) -> tuple:
    """'0.4.6.post5' -> (0, 4, 6, 5); '0.5.1' -> (0, 5, 1, -1); dev/rc builds sort before posts."""
    if not v:
        return ()
    import re

    m = re.match(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?(?:\.?post(\d+))?", v)
    if not m:
        return ()
    major, minor, patch, post = m.groups()
    return (int(major), int(minor), int(patch or 0), int(post) if post is not None else -1)


@dataclass
class Environment:
    """Facts about the server host that decide whether and how a fix applies. Any may be unknown
    (None); the fix says what it assumed."""

    host: str = "local"
    python: Optional[str] = None
    sglang_version: Optional[str] = None
    sglang_root: Optional[str] = None  # the sglang package folder (…/site-packages/sglang)
    flashinfer_version: Optional[str] = None
    torch_version: Optional[str] = None
    triton_version: Optional[str] = None
    gpu_name: Optional[str] = None
    compute_cap: Optional[str] = None  # "9.0"
    kv_cache_dtype: Optional[str] = None  # "fp8_e4m3", "auto", ...
    attention_backend: Optional[str] = None  # "flashinfer", "fa3", ...
    decode_attention_backend: Optional[str] = None
    dtype: Optional[str] = None
    server_url: Optional[str] = None
    sources: dict = field(default_factory=dict)  # fact -> where it was read
    notes: list = field(default_factory=list)
    server_args: dict = field(default_factory=dict, repr=False)  # /server_info as the server answered
    facts: dict = field(default_factory=dict)  # from the trace (--trace) and the request: findings, launch file

    @property
    def sm(self) -> Optional[tuple[int, int]]:
        if not self.compute_cap:
            return None
        try:
            a, b = self.compute_cap.strip().split(".")
            return int(a), int(b)
        except ValueError:
            return None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["server_args"] = len(self.server_args)  # the number of keys: the whole of it is 500+ keys
        return d


# ---------------------------------------------------------------------------------- fix parts


@dataclass(frozen=True)
class TargetSpec:
    """A file a fix knows how to change."""

    name: str  # "sglang-flashinfer-mla"
    relpath: Optional[str]  # path inside the sglang package, None for targets given by path only
    versions: str  # human-readable range, e.g. "0.4.6.post5 - 0.5.23"
    strategies: tuple[str, ...]
    backends: tuple[str, ...] = ()  # attention backends that run this file
    description: str = ""
    creates: bool = False  # the fix writes a file that may not exist yet (revert removes it again)


@dataclass
class Detection:
    """What a target file is: a known variant (patchable), already patched, or not."""

    target: str
    variant: Optional[str]  # known variant name, None if unknown
    state: str  # "original", "patched", "unknown", "refused", "not-applicable"
    reason: str = ""
    patched_strategy: Optional[str] = None
    anchors: list = field(default_factory=list)  # [{"what":..., "line":...}]
    facts: dict = field(default_factory=dict)  # anything the transformation needs


@dataclass
class StrategyChoice:
    strategy: Optional[str]
    reason: str
    rejected: dict = field(default_factory=dict)  # strategy -> why not


@dataclass
class Plan:
    """A computed patch: the new bytes and why."""

    target: str
    path: str
    variant: str
    strategy: str
    before: bytes
    after: bytes
    sha256_before: str
    sha256_after: str
    diff: str
    notes: list = field(default_factory=list)


class FixModule:
    """Base class for a fix. Subclasses set the metadata and implement the hooks."""

    id: str = ""
    title: str = ""
    answers: tuple[str, ...] = ()  # finding ids from `perfscope diagnose`
    targets: tuple[TargetSpec, ...] = ()
    strategies: tuple[str, ...] = ()
    requirements: dict = {}  # strategy -> text
    marker: str = ""  # a line present in every patched file
    kind: str = "source"  # source: patches a file of the server's code; launch: flags (fixengine/flags.py)
    keep_only_if_faster: float = 0.0  # > 0: --restart-cmd reverts unless TPOT drops by more than this fraction
    folder: Any = None  # pathlib.Path of the fix folder (set by the registry)

    # ---- hooks
    def target_for(self, env: Environment, name: Optional[str]) -> TargetSpec:  # pragma: no cover
        raise NotImplementedError

    def detect(self, target: TargetSpec, data: bytes, env: Environment) -> Detection:  # pragma: no cover
        raise NotImplementedError

    def choose_strategy(
        self, target: TargetSpec, det: Detection, env: Environment, requested: str = "auto"
    ) -> StrategyChoice:  # pragma: no cover
        raise NotImplementedError

    def transform(
        self, target: TargetSpec, det: Detection, data: bytes, strategy: str
    ) -> tuple[bytes, list]:  # pragma: no cover
        raise NotImplementedError

    def postconditions(
        self, target: TargetSpec, det: Detection, before: bytes, after: bytes, strategy: str
    ) -> list[str]:  # pragma: no cover
        """Problems with a patched file (empty list: all good)."""
        raise NotImplementedError

    def prepare(self, host: Any, env: Environment, target: TargetSpec, path: str, det: Detection) -> Optional[str]:
        """Work an apply does before its transform (e.g. measure on the host); a reason to refuse, or None."""
        return None

    def applicable(self, env: Environment, target: TargetSpec) -> Optional[str]:
        """A reason this fix has nothing to do on this server (e.g. no FP8 KV), or None."""
        return None

    # ---- docs
    @property
    def doc(self) -> str:
        if self.folder is None:
            return ""
        p = self.folder / "README.md"
        return p.read_text(encoding="utf-8") if p.is_file() else ""

    def summary(self) -> dict:
        return {
            "id": self.id,
            "title": self.title,
            "answers": list(self.answers),
            "strategies": list(self.strategies),
            "requirements": dict(self.requirements),
            "targets": [
                {
                    "name": t.name,
                    "file": t.relpath,
                    "versions": t.versions,
                    "strategies": list(t.strategies),
                    "backends": list(t.backends),
                    "description": t.description,
                }
                for t in self.targets
            ],
        }
