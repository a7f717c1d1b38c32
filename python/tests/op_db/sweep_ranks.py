"""Running a mode's body on its ranks (threads, the 1-rank CUDA mesh, or processes) and classifying
what they raised as one Failure, the same on every rank; for ranks as processes, the outcome
exchange (NOTE [sweep with processes] in sweep.py)."""

import json

import torch

import dtensor
import sweep_modes  # WORLD, which use_cuda and use_processes rebind
from sweep_modes import _Target


class Failure(Exception):
    def __init__(self, kind, message):
        super().__init__(message)
        self.kind = kind


def _run_on_ranks(world, fn):
    """Runs fn(rank) on `world` thread ranks (with _Target.mesh set: fn(0) in this thread on it;
    on processes: fn(this rank), every rank's result gathered, NOTE [sweep with processes]);
    classifies what they raised as a Failure, the same on every rank."""
    def guarded(rank):
        try:
            return fn(rank)
        except Exception as e:  # noqa: BLE001  (classified below, over all ranks)
            return e

    _Target.runs += 1
    if _Target.processes:
        if world != sweep_modes.WORLD:
            raise Failure("error", f"a mesh of {world} ranks; the sweep runs on "
                                   f"{sweep_modes.WORLD} processes (NOTE [sweep with processes])")
        if _Target.broken:
            raise Failure("hang", f"not run: {_Target.broken}")
        results = _gathered(guarded(_Target.root.get_rank()))
    elif _Target.mesh is not None:
        if world != _Target.mesh.size():
            raise Failure("error", f"a mesh of {world} ranks; the sweep runs on one "
                                   f"({_Target.device}, NOTE [sweep on CUDA])")
        results = [guarded(0)]
    else:
        results = dtensor.run_threads(world, guarded)
    _classify(world, results)


def _type_name(e):
    """The exception's type name (for another rank's, the name it had there)."""
    return e.type_name if isinstance(e, _RankError) else type(e).__name__


def _text(e):
    msg = str(e).strip()
    return msg.splitlines()[0] if msg else _type_name(e)


def _classify(world, results):
    """Raises the Failure that every rank's result (True, or what it raised) amounts to."""
    errors = [(r, e) for r, e in enumerate(results) if isinstance(e, Exception)]
    if not errors:
        return
    text = _text

    timeouts = [r for r, e in errors if "did not arrive within the timeout" in str(e)]
    causes = [(r, e) for r, e in errors if r not in timeouts]
    if timeouts:  # ranks diverged: some wait in a collective the others never join
        cause = (f"; rank {causes[0][0]} raised {_type_name(causes[0][1])}: "
                 f"{text(causes[0][1])}" if causes else "")
        where = sorted({text(e).split(" on group")[0] for r, e in errors if r in timeouts})
        raise Failure("hang", f"ranks {timeouts} timed out in a collective ({', '.join(where)})"
                              f"{cause}")
    if len(errors) != world:
        raise Failure("hang", f"only ranks {[r for r, _ in errors]} raised: {text(errors[0][1])}")
    r, e = errors[0]
    if isinstance(e, Failure):
        raise e
    raise Failure("error", f"{_type_name(e)}: {text(e)}")

# ---- ranks as processes: NOTE [sweep with processes] --------------------------------------------
_EXCHANGE_PURPOSE = "op_db sweep outcome"  # NOTE [collective purpose]: never pairs with an op's
_EXCHANGE_BYTES = 4096
_EXCHANGE_TRIES = 16  # a diverged peer meets at most a few exchanges before its own


class _RankError(Exception):
    """What another rank raised (not a Failure): its type's name and message."""

    def __init__(self, type_name, message):
        super().__init__(message)
        self.type_name = type_name


def _exchange(record):
    """Every rank's `record` (JSON), by rank, each with "diverged": whether a peer's collective
    met that rank's exchange first (the ranks diverged). Raises RuntimeError when the group
    cannot exchange."""
    from dtensor import _functional_collectives as funcol

    diverged = False
    for attempt in range(_EXCHANGE_TRIES):
        data = json.dumps(dict(record, diverged=diverged)).encode()
        if len(data) > _EXCHANGE_BYTES:
            raise RuntimeError(f"an outcome record of {len(data)} bytes (at most "
                               f"{_EXCHANGE_BYTES})")
        buf = torch.zeros(_EXCHANGE_BYTES, dtype=torch.uint8)
        buf[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        try:
            with funcol._purpose(_EXCHANGE_PURPOSE):
                out = funcol.all_gather_tensor(buf, 0, _Target.root).wait()
        except Exception as e:  # noqa: BLE001
            if "ranks disagree" in str(e) and attempt + 1 < _EXCHANGE_TRIES:
                diverged = True  # a peer's op collective met this exchange: both failed; again
                continue
            raise RuntimeError(f"the outcome exchange failed: {_text(e)}") from e
        rows = out.reshape(sweep_modes.WORLD, _EXCHANGE_BYTES)
        return [json.loads(bytes(row.tolist()).rstrip(b"\0").decode()) for row in rows]
    raise AssertionError("unreachable")


def _record(result, at):
    """This rank's result as an exchange record (messages cut to fit)."""
    if isinstance(result, Failure):
        kind, name, msg = "failure", result.kind, str(result)
    elif isinstance(result, Exception):
        kind, name, msg = "raised", _type_name(result), str(result)
    else:
        kind, name, msg = "passed", "", ""
    return {"at": at, "kind": kind, "name": name, "message": msg[:1500]}


def _result(rec):
    if rec["kind"] == "failure":
        return Failure(rec["name"], rec["message"])
    if rec["kind"] == "raised":
        return _RankError(rec["name"], rec["message"])
    return True


def _gathered(mine):
    """Every rank's result of this mode (a list by rank, as dtensor.run_threads gives), from
    this rank's `mine`; raises Failure("hang") when the ranks diverged, are out of step or
    cannot exchange (then _Target.broken says why and the sweep stops)."""
    rank = _Target.root.get_rank()
    try:
        recs = _exchange(_record(mine, _Target.runs))
    except RuntimeError as e:
        _Target.broken = str(e)
        if mine is True:
            raise Failure("hang", f"rank {rank} passed; {e}")
        raise Failure("hang", f"rank {rank} raised {_type_name(mine)}: {_text(mine)}; the "
                              f"outcomes could not be gathered (the group is broken)")
    results = [_result(r) for r in recs]
    at = [r["at"] for r in recs]
    if len(set(at)) != 1:
        _Target.broken = "ranks out of step: " + ", ".join(
            f"rank {r} at mode run #{x}" for r, x in enumerate(at))
        raise Failure("hang", _Target.broken)
    if any(r["diverged"] for r in recs):
        # The ranks whose op's collective met a peer's exchange say so in their error; the
        # others say what made them leave the op early.
        met = [r for r, x in enumerate(results) if _EXCHANGE_PURPOSE in str(x)]
        said = "; ".join(f"rank {r} {_said(x)}" for r, x in enumerate(results) if r not in met)
        detail = f"ranks diverged: {said}"
        if met:
            detail += (f"; while ranks {met} were in a collective of the op, which met that "
                       f"outcome exchange ({_text(results[met[0]])[:160]}...)")
        raise Failure("hang", detail)
    return results


def _said(x):
    if x is True:
        return "passed"
    if isinstance(x, Failure):
        return f"{x.kind}: {_text(x)}"
    return f"raised {_type_name(x)}: {_text(x)[:200]}"


def _agreed(what, value):
    """Every rank's `value`, by rank, after checking that every rank is at `what` (processes;
    on threads: [value]). On failure _Target.broken says why and the list holds only `value`."""
    if not _Target.processes:
        return [value]
    if not _Target.broken:
        try:
            recs = _exchange({"at": what, "value": value})
            if len({json.dumps(r["at"]) for r in recs}) == 1:
                return [r["value"] for r in recs]
            _Target.broken = ("ranks out of step: " +
                              ", ".join(f"rank {r} at {x['at']}" for r, x in enumerate(recs)))
        except RuntimeError as e:
            _Target.broken = str(e)
    return [value]
