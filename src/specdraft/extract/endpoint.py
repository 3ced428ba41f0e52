"""``specdraft extract --endpoint URL[,URL...]``: hidden states from running ``specdraft serve``
servers (vLLM's OpenAI server with the capture on, :mod:`specdraft.engines.live`); no engine
is started here and the verifier is never reloaded between generation and extraction.

Each row is one ``POST /v1/completions`` (``prompt`` = its token ids, ``max_tokens`` 1,
``kv_transfer_params.hidden_states_path`` = a file under ``--capture-dir`` named by row, server
and attempt); the server's connector writes that file atomically when the request finishes
(after the HTTP answer: the file is awaited). So the directory must be storage that the servers
and this process both see (docs/scale.md). Each file is checked against the prepared token ids,
converted exactly as the offline vLLM backend converts its engine's files
(:func:`specdraft.extract.vllm_backend.to_packed`: the final norm applied once, to vLLM's
pre-norm id ``N``) and handed to the same writer, in plan order, so the shards, index and
manifest are those of the other backends.

Rows are spread over the servers: every server runs ``--endpoint-concurrency`` requests at a
time, each taking the next row of one shared queue, so a fast server takes more rows. A server
that fails (connection refused or dropped, HTTP 5xx, no file within ``--endpoint-timeout-s``)
is set aside, its rows in flight go back to the front of the queue for the others, and it is
asked ``/health`` every few seconds to rejoin; with no server left the run waits up to
``--endpoint-timeout-s`` for one, then stops (finished shards kept: ``--resume``). A row is
written once, whichever server answered it (the writer takes each plan position once).

Identity, before any row (:func:`check_servers`): ``/v1/models`` must list a model; the layer
ids a server captures (its served name :func:`specdraft.engines.capture.descriptor`) must be the
run's; its model path, when this machine sees it, must be the run's verifier (the same path, or
:func:`specdraft.core.verifier_identity.identify` equal); then one probe row is captured by
every server (:func:`probe`): shape ``[T, ids, H]``, the servers agree with each other, and the
verifier's own head on the captured final state picks the token the server answered.
"""

from __future__ import annotations

import collections
import contextlib
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import httpx
import torch

from specdraft.core.errors import ConfigError, InputError
from specdraft.engines.process import EngineError
from specdraft.extract.vllm_backend import EngineVerifier, final_norm, read_row, to_packed
from specdraft.extract.writer import progress_fields

#: How often a set-aside server is asked ``/health`` (s).
REJOIN_EVERY_S = 2.0
#: Probe agreement between servers: ``|a - b| <= tol · max|b|`` per dtype (TP layouts round
#: differently; bf16 keeps 8 bits).
PROBE_TOL = {torch.float32: 1e-3, torch.float16: 2e-2, torch.bfloat16: 2e-2}


class ServerDown(Exception):
    """A server failed a request (unreachable, dropped, 5xx, no file in time)."""


def base_url(url: str) -> str:
    """``http://h:p`` from ``http://h:p/``, ``http://h:p/v1`` (both spellings are accepted)."""
    url = url.rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


def make_client(url: str, timeout_s: float) -> httpx.Client:
    """The HTTP client of one server (tests replace it with an in-process transport)."""
    return httpx.Client(base_url=url, timeout=timeout_s)


@dataclass
class Server:
    """One ``--endpoint`` server: its client, what ``/v1/models`` said (``model``: the name
    requests send; ``root``: its model path; ``capture_ids``: the layer ids it captures, None
    when its names do not say), whether it takes rows now, and its counts."""

    index: int
    url: str
    client: httpx.Client
    model: str = ""
    root: str = ""
    capture_ids: list[int] | None = None
    alive: bool = True
    rows: int = 0
    failures: list[str] = field(default_factory=list)


def connect(urls: Sequence[str], timeout_s: float) -> list[Server]:
    """One :class:`Server` per URL (duplicates refused: a row must go to one server once)."""
    bases = [base_url(u) for u in urls]
    if len(set(bases)) != len(bases):
        raise ConfigError(f"--endpoint {','.join(urls)}: a server is named twice")
    return [Server(i, b, make_client(b, timeout_s)) for i, b in enumerate(bases)]


def read_models(server: Server) -> None:
    """Fill ``server``'s model name, model path and capture ids from ``GET /v1/models``.
    Raises :class:`ServerDown` when it does not answer, :class:`InputError` when it lists no
    model."""
    from specdraft.engines.capture import parse_descriptor

    try:
        r = server.client.get("/v1/models")
    except httpx.HTTPError as err:
        raise ServerDown(f"{server.url}: {type(err).__name__}: {err}") from None
    if r.status_code != 200:
        raise ServerDown(f"{server.url}/v1/models: HTTP {r.status_code}")
    data = r.json().get("data") or []
    if not data:
        raise InputError(f"--endpoint {server.url}: /v1/models lists no model")
    names = [str(d.get("id", "")) for d in data]
    server.model, server.root = names[0], str(data[0].get("root") or "")
    server.capture_ids = parse_descriptor(names)


def healthy(server: Server) -> bool:
    """Whether ``GET /health`` answers 200 now."""
    try:
        return server.client.get("/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def capture_one(server: Server, key: str, row: int, input_ids: Sequence[int], capture_dir: Path,
                attempt: int, timeout_s: float) -> tuple[torch.Tensor, int | None]:
    """Capture dataset row ``row`` (key ``key``) on ``server``: ``(hidden [T, ids, H] in the
    server's dtype, the token the server answered or None)``; the file is read, checked against
    ``input_ids`` (:func:`specdraft.extract.vllm_backend.read_row`) and deleted. Raises
    :class:`ServerDown` (unreachable, 5xx, no file within ``timeout_s``), :class:`InputError`
    (the server refused the row: HTTP 4xx, e.g. longer than its context; tokens differ) or
    :class:`ConfigError` (its answer does not name the path as the one it writes: no capture,
    or a connector that ignores request paths)."""
    path = capture_dir / f"row{row:09d}-s{server.index}-a{attempt}.safetensors"
    body = {"model": server.model, "prompt": list(map(int, input_ids)), "max_tokens": 1,
            "temperature": 0.0, "return_token_ids": True,
            "kv_transfer_params": {"hidden_states_path": str(path)}}
    deadline = time.monotonic() + timeout_s
    try:
        r = server.client.post("/v1/completions", json=body)
    except httpx.HTTPError as err:
        raise ServerDown(f"{server.url}: row {key}: {type(err).__name__}: {err}") from None
    if r.status_code >= 500:
        raise ServerDown(f"{server.url}: row {key}: HTTP {r.status_code} {r.text[:200]}")
    if r.status_code != 200:
        raise InputError(f"row {key}: --endpoint {server.url} refused it: HTTP {r.status_code} "
                         f"{r.text[:300]}")
    answer = r.json()
    said = (answer.get("kv_transfer_params") or {}).get("hidden_states_path")
    if said != str(path):  # the connector names the path it will write (request_finished)
        raise ConfigError(f"--endpoint {server.url}: row {key}: the server does not capture "
                          f"hidden states to the path asked (its answer's kv_transfer_params: "
                          f"{answer.get('kv_transfer_params')}): start it with specdraft serve")
    while not path.exists():  # the connector writes after the answer, atomically
        if time.monotonic() > deadline:
            raise ServerDown(f"{server.url}: row {key}: no states file {path} within "
                             f"{timeout_s:g} s (is --capture-dir storage the server sees?)")
        time.sleep(0.005)
    hidden = read_row(path, key, input_ids)
    path.unlink(missing_ok=True)
    choice = (answer.get("choices") or [{}])[0]
    answered = (choice.get("token_ids") or [None])[0]
    return hidden, answered


# ---------------------------------------------------------------- identity, before any row


def _root_check(server: Server, verifier_dir: Path) -> str:
    """How ``server``'s model path relates to the run's verifier: ``same path``, ``same
    fingerprint`` or ``not visible here``. Raises :class:`ConfigError` for another model."""
    from specdraft.core.verifier_identity import compare, identify

    root = Path(server.root) if server.root else None
    if root is None or not (root / "config.json").is_file():
        return "not visible here (the probe vouches for it)"
    if root.resolve() == verifier_dir.resolve():
        return "same path"
    found = compare(identify(verifier_dir), identify(root))
    if found.kind not in ("same", "variant"):
        raise ConfigError(f"--endpoint {server.url} serves {root}, not the run's verifier "
                          f"{verifier_dir}: {'; '.join(found.differences) or found.kind}")
    return f"same fingerprint ({found.kind})"


def check_servers(servers: Sequence[Server], engine_ids: Sequence[int], verifier_dir: Path
                  ) -> dict[str, Any]:
    """The identity checks before any row (module doc): every server answers ``/v1/models``,
    captures ``engine_ids`` and serves the run's verifier. Returns ``{url: {model, root,
    capture_ids, root_check}}`` for the manifest. Raises :class:`EngineError` (a server that
    does not answer) or :class:`ConfigError` (another model, other layer ids)."""
    record = {}
    for s in servers:
        try:
            read_models(s)
        except ServerDown as err:
            raise EngineError(f"--endpoint: cannot reach {err}") from None
        if s.capture_ids is not None and list(s.capture_ids) != list(engine_ids):
            raise ConfigError(f"--endpoint {s.url} captures vLLM layer ids {s.capture_ids}, "
                              f"this run needs {list(engine_ids)} (aux ids + N): restart it "
                              f"with specdraft serve --aux-layers matching extract's")
        if s.capture_ids is None:
            print(f"extract: {s.url} does not say which layer ids it captures (not started by "
                  f"specdraft serve); assuming {list(engine_ids)}", file=sys.stderr)
        record[s.url] = {"model": s.model, "root": s.root, "capture_ids": s.capture_ids,
                         "root_check": _root_check(s, verifier_dir)}
    return record


def probe(servers: Sequence[Server], verifier: EngineVerifier, engine_ids: Sequence[int],
          key: str, row: int, input_ids: Sequence[int], capture_dir: Path, timeout_s: float
          ) -> torch.Tensor:
    """Capture one row on every server and check it (module doc); returns the first server's
    states ``[T, ids, H]`` (in the servers' dtype).

    Raises :class:`ConfigError` naming the server whose states have another shape or dtype than
    the others, differ from the first server's beyond :data:`PROBE_TOL`, or whose final state,
    through the verifier's own final norm and ``lm_head``, does not pick the token the server
    itself answered (another head, another final norm, or a layer ``N`` that is not the last)."""
    first: torch.Tensor | None = None
    n, H = len(engine_ids), verifier.hidden_size
    for s in servers:
        try:
            hidden, answered = capture_one(s, key, row, input_ids, capture_dir, 0, timeout_s)
        except ServerDown as err:
            raise EngineError(f"--endpoint probe: {err}") from None
        if tuple(hidden.shape) != (len(input_ids), n, H):
            raise ConfigError(f"--endpoint {s.url}: probe row {key} came back "
                              f"{list(hidden.shape)}, expected [{len(input_ids)}, {n}, {H}] "
                              f"(tokens, captured ids {list(engine_ids)}, hidden size)")
        if first is not None:
            if hidden.dtype != first.dtype:
                raise ConfigError(f"--endpoint {s.url} runs {hidden.dtype}, "
                                  f"{servers[0].url} {first.dtype}: serve one dtype")
            tol = PROBE_TOL.get(first.dtype, 2e-2)
            worst = float((hidden.float() - first.float()).abs().max()
                          / first.float().abs().max().clamp_min(1e-30))
            if worst > tol:
                raise ConfigError(f"--endpoint {s.url}: probe row {key} differs from "
                                  f"{servers[0].url}'s by {worst:.3g} of its largest value "
                                  f"(> {tol:g}): the servers do not serve the same verifier")
        first = hidden if first is None else first
        _check_answer(s, verifier, engine_ids, hidden, answered, key)
    assert first is not None
    return first


def _check_answer(server: Server, verifier: EngineVerifier, engine_ids: Sequence[int],
                  hidden: torch.Tensor, answered: int | None, key: str) -> None:
    """The verifier's head on the server's final state at the last position must rank the
    server's own answer first (within ``1e-3`` of the top logit: ties)."""
    if answered is None:
        raise ConfigError(f"--endpoint {server.url}: its completion carries no token_ids "
                          f"(return_token_ids): not a vLLM OpenAI server specdraft knows")
    last = hidden[-1, list(engine_ids).index(verifier.n_layers)].float()  # [H]
    normed = final_norm(last, verifier.norm_weight.float(), verifier.eps, verifier.norm_gain)
    logits = verifier.head["lm_head.weight"].float() @ normed  # [V]
    if not 0 <= answered < logits.shape[0] or \
            float(logits.max() - logits[answered]) > 1e-3 * float(logits.abs().max()):
        raise ConfigError(f"--endpoint {server.url}: on probe row {key} it answered token "
                          f"{answered}, the run's verifier head on its captured final state "
                          f"picks {int(logits.argmax())}: another head or final norm than "
                          f"the run's verifier")


# ---------------------------------------------------------------- the capture loop


class _Dispatch:
    """The shared queue of plan positions, with a window: a position is handed out only while
    it lies within ``window`` of the next one the writer waits for (bounded memory)."""

    def __init__(self, n: int, window: int) -> None:
        self.todo = collections.deque(range(n))
        self.window, self.next_needed = window, 0
        self.cond = threading.Condition()
        self.stop = False
        self.attempts: dict[int, int] = collections.Counter()

    def take(self, server: Server) -> tuple[int, int] | None:
        with self.cond:
            while not self.stop and server.alive and (
                    not self.todo or self.todo[0] >= self.next_needed + self.window):
                self.cond.wait(0.2)
            if self.stop or not server.alive:
                return None
            i = self.todo.popleft()
            self.attempts[i] += 1
            return i, self.attempts[i]

    def give_back(self, i: int) -> None:
        with self.cond:
            self.todo.appendleft(i)
            self.cond.notify_all()

    def advance(self, next_needed: int) -> None:
        with self.cond:
            self.next_needed = next_needed
            self.cond.notify_all()

    def halt(self) -> None:
        with self.cond:
            self.stop = True
            self.cond.notify_all()


def _serve_rows(server: Server, dispatch: _Dispatch, results: Any, job: dict[str, Any]) -> None:
    """One request slot of ``server``: take a position, capture, convert, report; a failure of
    the server gives the position back and sets the server aside."""
    while (got := dispatch.take(server)) is not None:
        i, attempt = got
        r = job["rows"][i]
        try:
            hidden, _ = capture_one(server, job["keys"][r], r, job["ids"][i],
                                    job["capture_dir"], attempt, job["timeout_s"])
            packed = to_packed(hidden, job["masks"][i], job["aux_ids"], job["engine_ids"],
                               job["verifier"], job["codec"])
        except ServerDown as err:
            dispatch.give_back(i)
            if server.alive:
                server.alive = False
                server.failures.append(str(err))
                print(f"extract: {err}; its rows go to the other servers", file=sys.stderr)
            results.put(("down", server.index, None))
            return
        except BaseException as err:  # noqa: BLE001 - re-raised by the main thread
            results.put(("error", i, err))
            return
        server.rows += 1
        results.put(("row", i, packed))


def _start(server: Server, dispatch: _Dispatch, results: Any, job: dict[str, Any],
           slots: int) -> list[threading.Thread]:
    threads = [threading.Thread(target=_serve_rows, args=(server, dispatch, results, job),
                                name=f"endpoint-{server.index}-{k}", daemon=True)
               for k in range(slots)]
    for t in threads:
        t.start()
    return threads


def _rejoin(servers: Sequence[Server], dispatch: _Dispatch, results: Any, job: dict[str, Any],
            slots: int, threads: list[threading.Thread]) -> None:
    """Bring back a set-aside server that answers ``/health`` and still serves the same model
    path and layer ids (its slots restart)."""
    for s in servers:
        if s.alive or any(t.is_alive() and t.name.startswith(f"endpoint-{s.index}-")
                          for t in threads):
            continue
        before = (s.root, s.capture_ids)
        try:
            if not healthy(s):
                continue
            read_models(s)
        except (ServerDown, InputError):
            continue
        if (s.root, s.capture_ids) != before:
            continue  # another model now: it stays aside
        print(f"extract: {s.url} answers again; it takes rows again", file=sys.stderr)
        s.alive = True
        threads.extend(_start(s, dispatch, results, job, slots))


def capture_rows(servers: Sequence[Server], job: dict[str, Any], writer: Any, *,
                 slots: int, timeout_s: float, progress: Any = None) -> None:
    """Capture every plan position of ``job`` (``rows``, ``keys``, ``ids``, ``masks``,
    ``aux_ids``, ``engine_ids``, ``verifier``, ``codec``, ``capture_dir``, ``timeout_s``)
    through ``servers`` and submit each row to ``writer`` once, in plan order (module doc).
    ``progress``: the stage's :class:`~specdraft.core.progress.StageProgress`, given each row's
    real tokens as the row is written.
    Raises :class:`EngineError` when no server has answered for ``timeout_s`` seconds, or the
    error of a row (:class:`InputError` naming it)."""
    import queue

    n = len(job["rows"])
    dispatch = _Dispatch(n, window=max(4 * slots * len(servers), 8))
    results: queue.Queue = queue.Queue()
    threads = [t for s in servers for t in _start(s, dispatch, results, job, slots)]
    held: dict[int, Any] = {}
    nxt, last_rejoin, alone_since = 0, time.monotonic(), None
    last_row = time.monotonic()
    try:
        while nxt < n:
            try:
                kind, i, value = results.get(timeout=0.2)
            except queue.Empty:
                kind = None
            if kind == "error":
                raise value
            if kind == "row" and i >= nxt and i not in held:
                held[i], last_row = value, time.monotonic()
            while nxt in held:  # plan order: shard bytes never depend on arrival
                p = job["rows"][nxt]
                writer.submit([p], [job["ids"][nxt]], [job["masks"][nxt]], held.pop(nxt))
                nxt += 1
                if progress is not None:
                    progress.update(len(job["ids"][nxt - 1]), **progress_fields(nxt, writer))
                dispatch.advance(nxt)
            now = time.monotonic()
            if now - last_rejoin > REJOIN_EVERY_S and not all(s.alive for s in servers):
                last_rejoin = now
                _rejoin(servers, dispatch, results, job, slots, threads)
            if now - last_row > 2 * timeout_s + REJOIN_EVERY_S:  # never hang on a lost row
                raise EngineError(f"--endpoint: no row arrived for {2 * timeout_s:g} s; "
                                  f"{nxt} of {n} rows of this run captured: rerun with --resume")
            alive = any(s.alive for s in servers)
            alone_since = None if alive else (alone_since or now)
            if alone_since is not None and now - alone_since > timeout_s:
                raise EngineError(
                    f"--endpoint: no server has answered for {timeout_s:g} s ("
                    + "; ".join(f[-1] for s in servers for f in [s.failures] if f)
                    + f"); {nxt} of {n} rows of this run captured: rerun with --resume")
    finally:
        dispatch.halt()
        for t in threads:
            t.join(timeout=5)


def clean_capture_dir(capture_dir: Path, rows: Sequence[int]) -> None:
    """Delete files of ``rows`` an earlier attempt left (a server that answered after its row
    went elsewhere, a killed run): ``row{r:09d}-s*-a*.safetensors`` (and staging dirs)."""
    import shutil

    wanted = {f"row{r:09d}" for r in rows}
    if not capture_dir.exists():
        return
    for f in capture_dir.iterdir():
        if f.name.split("-")[0] in wanted:
            shutil.rmtree(f) if f.is_dir() else f.unlink(missing_ok=True)


# ---------------------------------------------------------------- the stage's two calls


def capture_dir(config: Any, rank: int) -> Path:
    """Where the servers write this rank's rows: ``--capture-dir`` (else ``RUN/extract/live``)
    ``/rank{r:05d}`` (under torchrun every rank probes the same row: one directory each)."""
    from specdraft.artifacts.layout import RunLayout

    base = Path(config.capture_dir or RunLayout(config.run_dir).extract / "live")
    return base / f"rank{rank:05d}"


def open_servers(config: Any, verifier: EngineVerifier, aux_ids: Sequence[int],
                 probe_row: tuple[str, int, Sequence[int]], *, rank: int = 0, codec: Any = None,
                 stored: tuple[dict[str, Any], dict[str, torch.Tensor]] | None = None
                 ) -> tuple[list[Server], dict[str, Any], EngineVerifier]:
    """Connect to ``config.endpoint``, check every server (:func:`check_servers`) and probe it
    with ``probe_row`` = ``(key, dataset row, token ids)`` (:func:`probe`), before any row.
    ``stored`` (``--resume``, :func:`stored_row`): a row the run already stored, probed instead
    and compared with what was stored (:func:`_compare_stored`, in ``codec``). Returns the
    servers, their record for the manifest, and ``verifier`` in the servers' dtype (``--dtype
    auto``; an explicit other ``--dtype`` raises :class:`ConfigError`)."""
    from specdraft.core.aux_ids import extraction_capture_ids
    from specdraft.extract.vllm_backend import load_engine_verifier

    engine_ids = extraction_capture_ids(aux_ids, verifier.n_layers)
    servers = connect(config.endpoint, config.endpoint_timeout_s)
    record = check_servers(servers, engine_ids, verifier.hf_dir)
    where = capture_dir(config, rank)
    where.mkdir(parents=True, exist_ok=True)
    if stored is not None:  # --resume: the probe is a row already stored
        probe_row = (stored[0]["key"], stored[0]["row"], stored[1]["input_ids"].tolist())
    clean_capture_dir(where, [probe_row[1]])
    hidden = probe(servers, verifier, engine_ids, *probe_row, where, config.endpoint_timeout_s)
    dtype = hidden.dtype
    if dtype != verifier.dtype:
        if config.dtype != "auto":
            raise ConfigError(f"--dtype {config.dtype}: the --endpoint servers run "
                              f"{str(dtype).removeprefix('torch.')}; pass --dtype auto or "
                              f"serve that dtype")
        verifier = load_engine_verifier(verifier.hf_dir, dtype)
    if stored is not None:
        _compare_stored(servers[0], verifier, aux_ids, engine_ids, hidden, stored, codec)
    return servers, {"servers": record, "capture_dir": str(where)}, verifier


def stored_row(out: Path, rank: int, codec: Any, groups: int, hidden: int
               ) -> tuple[dict[str, Any], dict[str, torch.Tensor]] | None:
    """The first row this rank already stored (``--resume``) that reads back: ``(its index
    entry, its decoded values)``; None when there is none."""
    from specdraft.core.jsonl import iter_jsonl, repair_torn_tail
    from specdraft.core.storage import ShardReader
    from specdraft.extract.writer import part_path

    part = part_path(out, rank)
    if not part.exists():
        return None
    repair_torn_tail(part)
    reader = ShardReader(out, codec, groups, hidden)
    for _, entry in iter_jsonl(part):
        try:
            return entry, reader.read(entry)
        except Exception:  # noqa: BLE001 - a shard a killed run left unreadable: the next one
            continue
    return None


#: Stored row against its capture now: one storage rounding step plus the engines' batch noise.
_STORED_REL = {"fp32": 0.0, "bf16": 2**-7, "fp8": 2**-3}


def _compare_stored(server: Server, verifier: EngineVerifier, aux_ids: Sequence[int],
                    engine_ids: Sequence[int], hidden: torch.Tensor,
                    stored: tuple[dict[str, Any], dict[str, torch.Tensor]], codec: Any) -> None:
    """``--resume``: the probe row, captured now, must equal what the run stored for it
    (``|now - stored| <= rel·|stored| + 1e-3·max|stored|``, rel = the storage's rounding):
    the servers serve the verifier that computed the stored rows. Raises
    :class:`ConfigError` naming the server and the row."""
    from specdraft.core.storage import decode

    entry, values = stored
    mask = values["loss_mask"].tolist()
    packed = to_packed(hidden, mask, aux_ids, engine_ids, verifier, codec)
    now = {"aux": decode(packed.aux[0], packed.aux[1], len(aux_ids)),
           "final": decode(packed.final[0], packed.final[1], 1)}
    rel = _STORED_REL.get(codec.name.split("-")[0], 2**-3)
    for name in ("aux", "final"):
        ref = values[name]
        if ref.numel() == 0:
            continue
        bound = rel * ref.abs() + 1e-3 * ref.abs().max()
        worst = float(((now[name] - ref).abs() / bound.clamp_min(1e-30)).max())
        if worst > 1.0:
            raise ConfigError(f"--endpoint {server.url}: stored row {entry['key']} captured "
                              f"now differs from what this run stored ({name} states, "
                              f"{worst:.3g}x the tolerance): the servers do not serve the "
                              f"verifier that computed the stored rows; resume with that one "
                              f"or start over with --overwrite")


def extract_rows_live(servers: Sequence[Server], verifier: EngineVerifier, config: Any, ctx: Any,
                      rows: Sequence[int], ids: Sequence[Sequence[int]],
                      masks: Sequence[Sequence[int]], writer: Any, *, rank: int = 0,
                      progress: Any = None) -> dict[str, Any]:
    """Capture ``rows`` (plan order) through ``servers`` into ``writer``
    (:func:`capture_rows`); returns the per-server counts and the capture's seconds."""
    from specdraft.core.aux_ids import extraction_capture_ids

    where = capture_dir(config, rank)
    clean_capture_dir(where, rows)
    job = {"rows": list(rows), "keys": ctx.keys, "ids": ids, "masks": masks,
           "aux_ids": ctx.aux_ids, "engine_ids": extraction_capture_ids(ctx.aux_ids,
                                                                         verifier.n_layers),
           "verifier": verifier, "codec": ctx.codec, "capture_dir": where,
           "timeout_s": config.endpoint_timeout_s}
    t0 = time.monotonic()
    capture_rows(servers, job, writer, slots=config.endpoint_concurrency,
                 timeout_s=config.endpoint_timeout_s, progress=progress)
    clean_capture_dir(where, rows)  # a late answer of a set-aside server
    with contextlib.suppress(OSError):
        where.rmdir()  # when empty
    return {"capture_seconds": round(time.monotonic() - t0, 3),
            "servers": {s.url: {"rows": s.rows, "failures": s.failures} for s in servers}}
