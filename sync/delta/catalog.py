"""The catalog: where each projection's tables live now. Every reader resolves names here.

A projection's *generation* is one directory holding everything the projection writes:
its Delta tables, its Spark checkpoint, its progress file, its fencing epochs and its
dead letters. Generation 0 is the lake itself (`<lake>/mirrors/...`,
`<lake>/_checkpoints/mirrors`, ...). `lakesync rebuild NAME` builds generation n+1 in
`<lake>/_generations/NAME/<n+1>` while generation n keeps serving; `--swap` points the
catalog at it.

The pointer is one small JSON file per projection, `<lake>/_catalog/NAME.json`, replaced
whole (a rename on POSIX, a PUT in a bucket: sync/lake.py). Every path function
(`mirror_path`, `ledger_path`, `checkpoint`, ...) reads it when called, so a reader
resolves the old generation or the new one, both complete, and never a mixture or a
half-built table.

A rebuild writes its new generation through settings whose `roots` override the
catalog for the projection it builds (`building`); everything else it reads (the views
read the live changelog, ledger and mirrors) still resolves through the catalog.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import Callable

from sync import lake
from sync.config import Settings
from sync.files import write_json_atomically
from sync.lake import LakePath
from sync.projection import Projection


def _pointer(settings: Settings, projection: str) -> LakePath:
    return settings.lake / "_catalog" / f"{projection}.json"


def entry(settings: Settings, projection: str) -> dict:
    """The catalog's entry for `projection`: {"generation", "root", "swapped_at"}."""
    try:
        return json.loads(_pointer(settings, projection).read_text())
    except FileNotFoundError:
        return {"generation": 0, "root": str(settings.lake), "swapped_at": None}


def root(settings: Settings, projection: str) -> LakePath:
    """The directory `projection`'s current generation lives in."""
    for name, folder in settings.roots:
        if name == projection:
            return lake.at(folder)
    return lake.at(entry(settings, projection)["root"])


def checkpoint(settings: Settings, projection: str) -> LakePath:
    return root(settings, projection) / "_checkpoints" / projection


def progress_file(settings: Settings, projection: str) -> LakePath:
    return root(settings, projection) / "_progress" / f"{projection}.json"


def building(settings: Settings, projection: str, generation: int) -> Settings:
    """Settings that write `projection` into a new generation (and push nothing to the
    search index: the live generation keeps it current)."""
    folder = settings.lake / "_generations" / projection / str(generation)
    return replace(settings, roots=((projection, str(folder)),), search_url="", metrics_port=0)


def swap(settings: Settings, projection: str, generation: int, folder: LakePath) -> dict:
    """Point the catalog at `folder`; returns the entry it replaced. Atomic for readers.
    The new entry names the generation it replaced (`replaced`) until `retire_replaced`
    has retired it: a process that dies between the two leaves that to the next."""
    old = entry(settings, projection)
    write_json_atomically(_pointer(settings, projection),
                          {"generation": generation, "root": str(folder), "swapped_at": time.time(),
                           "replaced": {"generation": old["generation"], "root": old["root"]}})
    return old


def swap_in(settings: Settings, projection: Projection, generation: int, folder: LakePath,
            say: Callable[[str], None]) -> None:
    """`rebuild --swap`'s steps 3c and 3d for one projection (sync/commands/rebuild.py):
    the catalog pointed at `folder`, then the generation it replaced retired (and first
    one an earlier swap left, before this swap's entry drops its name)."""
    retire_replaced(settings, projection, say)
    swap(settings, projection.name, generation, folder)
    say(f"swap: the catalog now points {projection.name} at generation {generation}")
    retire_replaced(settings, projection, say)


def retire_replaced(settings: Settings, projection: Projection, say: Callable[[str], None]) -> None:
    """Step 3d: retire the generation the catalog's entry still names as replaced, then
    drop the name. Called again by the runner's start and by the next swap, it finishes a
    swap whose process died between its steps; with no name left, it does nothing."""
    current = entry(settings, projection.name)
    old = current.get("replaced")
    if old is None:
        return
    if old["generation"] != current["generation"]:  # (never the generation serving)
        retire(settings, projection, old)
    write_json_atomically(_pointer(settings, projection.name), {k: v for k, v in current.items() if k != "replaced"})
    say(f"swap: {projection.name} generation {old['generation']} retired")


def clear(settings: Settings, projection: Projection) -> None:
    """Remove what `projection` wrote in its current generation: its tables, state,
    checkpoint and progress (its fencing epochs and the shared dead letters stay)."""
    parts = [lake.at(t.table) for t in projection.targets(settings) if t.delta]
    parts += [*projection.state_paths(settings), checkpoint(settings, projection.name)]
    for part in parts:
        lake.remove_tree(part)
    progress_file(settings, projection.name).unlink(missing_ok=True)


def retire(settings: Settings, projection: Projection, old: dict) -> None:
    """Delete a generation the catalog no longer points at. Generation 0 is the lake
    itself, shared with the other projections: only this projection's own parts go
    (and its dead letters stay, in the table the projections share there)."""
    if old["generation"] > 0:
        lake.remove_tree(old["root"])
        return
    gone = replace(settings, roots=((projection.name, old["root"]),))
    clear(gone, projection)
    lake.remove_tree(lake.at(old["root"]) / "_fencing" / projection.name)
