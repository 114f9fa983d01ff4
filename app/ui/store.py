"""Conversations in SQLite (the standard library's sqlite3, WAL), one owner per API key ("" without
keys: the one local owner). A conversation is its title, model, system prompt, sampling settings and
messages in order; an assistant message carries its figures (`stats`, from the API's `timings` and
`usage`) and its state: "done", "streaming" (the server is writing it), "stopped" (cut by a stop,
kept as far as it came) or "interrupted" (the server ended under it).

Every call opens its own connection (sqlite3 connections are not shared across threads); writes are
short transactions, so a crash loses at most the last unsaved part of an answer being written."""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    title TEXT NOT NULL,
    model TEXT NOT NULL DEFAULT '',
    system TEXT NOT NULL DEFAULT '',
    settings TEXT NOT NULL DEFAULT '{}',
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS conversations_owner ON conversations (owner, updated);
CREATE TABLE IF NOT EXISTS messages (
    id TEXT PRIMARY KEY,
    conversation TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    seq INTEGER NOT NULL,
    role TEXT NOT NULL,
    content TEXT NOT NULL DEFAULT '',
    reasoning TEXT NOT NULL DEFAULT '',
    tool_calls TEXT NOT NULL DEFAULT '[]',
    images TEXT NOT NULL DEFAULT '[]',
    stats TEXT NOT NULL DEFAULT '{}',
    state TEXT NOT NULL DEFAULT 'done',
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_conversation ON messages (conversation, seq);
"""
ROLES = ("system", "user", "assistant", "tool")
STATES = ("done", "streaming", "stopped", "interrupted", "error")
JSON_FIELDS = ("tool_calls", "images", "stats")


class NotFound(Exception):
    """No such conversation or message for this owner."""


class Invalid(Exception):
    """Input the store cannot take; the message names what is wrong."""


@dataclass(frozen=True)
class Message:
    role: str
    content: str = ""
    reasoning: str = ""
    tool_calls: list | None = None
    images: list | None = None
    stats: dict | None = None
    state: str = "done"
    created: float | None = None


def new_id() -> str:
    return uuid.uuid4().hex


def _message_row(row: sqlite3.Row) -> dict[str, Any]:
    out = {k: row[k] for k in ("id", "role", "content", "reasoning", "state", "created")}
    for k in JSON_FIELDS:
        out[k] = json.loads(row[k])
    return out


def _conversation_row(row: sqlite3.Row) -> dict[str, Any]:
    out = {k: row[k] for k in ("id", "title", "model", "system", "created", "updated")}
    out["settings"] = json.loads(row["settings"])
    return out


def message_of(d: Any, where: str) -> Message:
    """A message as a client gives it (an import, a PUT): role and content required."""
    if not isinstance(d, dict):
        raise Invalid(f"{where}: a message must be an object")
    role, content = d.get("role"), d.get("content", None)
    if role not in ROLES:
        raise Invalid(f"{where}.role: must be one of {', '.join(ROLES)}")
    if not isinstance(content, str):
        raise Invalid(f"{where}.content: must be a string")
    reasoning = d.get("reasoning") or ""
    if not isinstance(reasoning, str):
        raise Invalid(f"{where}.reasoning: must be a string")
    fields = {}
    for k, kind in (("tool_calls", list), ("images", list), ("stats", dict)):
        v = d.get(k)
        if v is not None and not isinstance(v, kind):
            raise Invalid(f"{where}.{k}: must be a {'list' if kind is list else 'object'}")
        fields[k] = v
    if fields["images"] and not all(isinstance(u, str) and u.startswith("data:image/") for u in fields["images"]):
        raise Invalid(f"{where}.images: each must be a data:image/... URL")
    state = d.get("state") or "done"
    if state not in STATES:
        raise Invalid(f"{where}.state: must be one of {', '.join(STATES)}")
    created = d.get("created")
    if created is not None and not isinstance(created, (int, float)):
        raise Invalid(f"{where}.created: must be a number (unix seconds)")
    return Message(role, content, reasoning, **fields, state="interrupted" if state == "streaming" else state,
                   created=created)


class Store:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # servers started together on one state folder (instances behind nginx) open it at once:
        # switching it to WAL takes a lock no busy timeout waits for, so that is tried again
        for attempt in range(50):
            try:
                with self._db(wal=True) as db:
                    db.executescript(SCHEMA)
                    # answers the server was writing when it last ended: kept as far as they came
                    db.execute("UPDATE messages SET state = 'interrupted' WHERE state = 'streaming'")
                break
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) or attempt == 49:
                    raise
                time.sleep(0.1)

    @contextmanager
    def _db(self, wal: bool = False) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.path, timeout=10)
        db.row_factory = sqlite3.Row
        try:
            if wal:  # once, at open: the mode stays with the file
                db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA foreign_keys=ON")
            with db:
                yield db
        finally:
            db.close()

    # -- conversations -----------------------------------------------------------------------

    def list(self, owner: str, query: str | None = None) -> list[dict]:
        """The owner's conversations, most recently updated first; `query`: only those whose title or
        any message holds the text (case-insensitive)."""
        sql = "SELECT c.*, (SELECT COUNT(*) FROM messages m WHERE m.conversation = c.id) AS n FROM conversations c WHERE owner = ?"
        args: list = [owner]
        if query:
            like = "%" + query.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            sql += (" AND (title LIKE ? ESCAPE '\\' OR EXISTS (SELECT 1 FROM messages m WHERE m.conversation = c.id"
                    " AND m.content LIKE ? ESCAPE '\\'))")
            args += [like, like]
        with self._db() as db:
            rows = db.execute(sql + " ORDER BY updated DESC", args).fetchall()
        return [{**_conversation_row(r), "messages": r["n"]} for r in rows]

    def get(self, owner: str, cid: str) -> dict:
        with self._db() as db:
            row = db.execute("SELECT * FROM conversations WHERE id = ? AND owner = ?", (cid, owner)).fetchone()
            if row is None:
                raise NotFound(f"no conversation {cid}")
            msgs = db.execute("SELECT * FROM messages WHERE conversation = ? ORDER BY seq", (cid,)).fetchall()
        return {**_conversation_row(row), "messages": [_message_row(m) for m in msgs]}

    def create(self, owner: str, title: str = "New chat", model: str = "", system: str = "", settings: dict | None = None,
               messages: list[Message] = (), cid: str | None = None, created: float | None = None) -> str:
        cid = cid or new_id()
        now = time.time()
        with self._db() as db:
            if db.execute("SELECT 1 FROM conversations WHERE id = ?", (cid,)).fetchone():
                raise Invalid(f"conversation {cid} exists")
            db.execute("INSERT INTO conversations VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                       (cid, owner, title, model, system, json.dumps(settings or {}), created or now, now))
            self._put_messages(db, cid, messages)
        return cid

    def update(self, owner: str, cid: str, title: str | None = None, model: str | None = None, system: str | None = None,
               settings: dict | None = None, messages: list[Message] | None = None) -> None:
        with self._db() as db:
            self._own(db, owner, cid)
            for k, v in (("title", title), ("model", model), ("system", system)):
                if v is not None:
                    db.execute(f"UPDATE conversations SET {k} = ? WHERE id = ?", (v, cid))  # noqa: S608 - k is ours
            if settings is not None:
                db.execute("UPDATE conversations SET settings = ? WHERE id = ?", (json.dumps(settings), cid))
            if messages is not None:
                db.execute("DELETE FROM messages WHERE conversation = ?", (cid,))
                self._put_messages(db, cid, messages)
            db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (time.time(), cid))

    def delete(self, owner: str, cid: str) -> None:
        with self._db() as db:
            self._own(db, owner, cid)
            db.execute("DELETE FROM conversations WHERE id = ?", (cid,))

    def import_many(self, owner: str, conversations: list[dict]) -> list[str]:
        """Conversations as exported (already checked by `conversation_of`), all or none."""
        ids = []
        now = time.time()
        with self._db() as db:
            for c in conversations:
                cid = new_id()
                db.execute("INSERT INTO conversations VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                           (cid, owner, c["title"], c["model"], c["system"], json.dumps(c["settings"]),
                            c["created"] or now, c["updated"] or now))
                self._put_messages(db, cid, c["messages"])
                ids.append(cid)
        return ids

    def export(self, owner: str) -> Iterator[dict]:
        for c in self.list(owner):
            one = self.get(owner, c["id"])
            yield {**{k: one[k] for k in ("title", "model", "system", "settings", "created", "updated")},
                   "messages": [{k: v for k, v in m.items() if k != "id"} for m in one["messages"]]}

    # -- messages ----------------------------------------------------------------------------

    def append(self, owner: str, cid: str, m: Message) -> str:
        with self._db() as db:
            self._own(db, owner, cid)
            mid = self._put_messages(db, cid, [m])[0]
            db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (time.time(), cid))
        return mid

    def truncate(self, owner: str, cid: str, keep: int) -> None:
        """Keep the first `keep` messages (regenerate, edit and resend)."""
        with self._db() as db:
            self._own(db, owner, cid)
            db.execute("DELETE FROM messages WHERE conversation = ? AND seq >= ?", (cid, keep))

    def write(self, mid: str, **fields: Any) -> None:
        """An answer being written: its text so far, its figures, its state."""
        sets = ", ".join(f"{k} = ?" for k in fields)
        values = [json.dumps(v) if k in JSON_FIELDS else v for k, v in fields.items()]
        with self._db() as db:
            db.execute(f"UPDATE messages SET {sets} WHERE id = ?", (*values, mid))  # noqa: S608 - keys are ours

    def message(self, owner: str, mid: str) -> dict:
        with self._db() as db:
            row = db.execute("SELECT m.* FROM messages m JOIN conversations c ON c.id = m.conversation "
                             "WHERE m.id = ? AND c.owner = ?", (mid, owner)).fetchone()
        if row is None:
            raise NotFound(f"no message {mid}")
        return _message_row(row)

    # -- inside ------------------------------------------------------------------------------

    @staticmethod
    def _own(db: sqlite3.Connection, owner: str, cid: str) -> None:
        if db.execute("SELECT 1 FROM conversations WHERE id = ? AND owner = ?", (cid, owner)).fetchone() is None:
            raise NotFound(f"no conversation {cid}")

    @staticmethod
    def _put_messages(db: sqlite3.Connection, cid: str, messages: list[Message]) -> list[str]:
        seq = db.execute("SELECT COALESCE(MAX(seq) + 1, 0) FROM messages WHERE conversation = ?", (cid,)).fetchone()[0]
        ids = []
        for i, m in enumerate(messages):
            mid = new_id()
            db.execute("INSERT INTO messages VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       (mid, cid, seq + i, m.role, m.content, m.reasoning, json.dumps(m.tool_calls or []),
                        json.dumps(m.images or []), json.dumps(m.stats or {}), m.state, m.created or time.time()))
            ids.append(mid)
        return ids


def conversation_of(d: Any, where: str) -> dict:
    """One conversation as a client gives it (an import line): `title` and `messages` required."""
    if not isinstance(d, dict):
        raise Invalid(f"{where}: must be a JSON object")
    title = d.get("title")
    if not isinstance(title, str) or not title.strip():
        raise Invalid(f"{where}.title: must be a non-empty string")
    msgs = d.get("messages")
    if not isinstance(msgs, list):
        raise Invalid(f"{where}.messages: must be a list")
    out = {"title": title, "messages": [message_of(m, f"{where}.messages[{i}]") for i, m in enumerate(msgs)]}
    for k, kind, default in (("model", str, ""), ("system", str, ""), ("settings", dict, {})):
        v = d.get(k, default)
        if v is None:
            v = default
        if not isinstance(v, kind):
            raise Invalid(f"{where}.{k}: must be a {'string' if kind is str else 'object'}")
        out[k] = v
    for k in ("created", "updated"):
        v = d.get(k)
        if v is not None and not isinstance(v, (int, float)):
            raise Invalid(f"{where}.{k}: must be a number (unix seconds)")
        out[k] = v
    return out
