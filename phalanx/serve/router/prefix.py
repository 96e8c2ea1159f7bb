"""The kv-aware policy's prefix index: which prompt blocks each replica has most likely
cached, learned from what the router sent it.

A prompt is cut into blocks of `block_chars` characters (the router sees text, not the
engine's tokens); block i's hash covers blocks 0..i (chained, as the engines' own prefix
caches key their KV blocks), so a match on block i means the whole prefix up to it matches.
Only whole blocks count. Memory is bounded: each replica keeps at most `max_blocks` hashes,
dropping its least recently used (an engine's cache evicts the same way).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from typing import Any

DEFAULT_MAX_BLOCKS = 65_536  # per replica; 8-byte keys → a few MB per replica at most


def block_hashes(text: str, block_chars: int) -> tuple[bytes, ...]:
    """The chained hashes of `text`'s whole blocks of `block_chars` characters."""
    out: list[bytes] = []
    previous = b""
    # Blocks are cut on characters, hashed as UTF-8.
    pieces = (
        text[i : i + block_chars].encode("utf-8", "surrogatepass")
        for i in range(0, len(text) - block_chars + 1, block_chars)
    )
    for piece in pieces:
        previous = hashlib.blake2b(previous + piece, digest_size=8).digest()
        out.append(previous)
    return tuple(out)


def render_chat(messages: Sequence[Any]) -> str:
    """A chat's messages as one deterministic text for hashing (what a chat template would
    put first stays first: the system prompt and earlier turns make the shared prefix)."""
    parts: list[str] = []
    for message in messages:
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        content = message.get("content")
        if isinstance(content, list):  # content parts: the text ones
            content = "".join(
                p.get("text", "")
                for p in content
                if isinstance(p, dict) and p.get("type") == "text"
            )
        parts.append(f"<|{role}|>{content if isinstance(content, str) else ''}\n")
    return "".join(parts)


def prompt_text(path: str, body: dict[str, Any]) -> str:
    """The text a completion or chat request's prefix is hashed from ("" if none)."""
    if path.endswith("/chat/completions"):
        messages = body.get("messages")
        return render_chat(messages) if isinstance(messages, list) else ""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        return prompt[0]  # a batch of prompts: the first decides
    return ""


class PrefixIndex:
    """Per replica, an LRU set of block hashes it was sent."""

    def __init__(self, max_blocks: int = DEFAULT_MAX_BLOCKS) -> None:
        if max_blocks < 1:
            raise ValueError("max_blocks must be at least 1")
        self.max_blocks = max_blocks
        self._blocks: dict[Hashable, OrderedDict[bytes, None]] = {}

    def matched(self, replica: Hashable, hashes: Sequence[bytes]) -> int:
        """How many leading blocks of `hashes` the replica has (chained hashes: the first
        miss ends the prefix)."""
        blocks = self._blocks.get(replica)
        if not blocks:
            return 0
        n = 0
        for h in hashes:
            if h not in blocks:
                break
            n += 1
        return n

    def add(self, replica: Hashable, hashes: Sequence[bytes]) -> None:
        """The replica was sent these blocks: they become its most recently used."""
        if not hashes:
            return
        blocks = self._blocks.setdefault(replica, OrderedDict())
        for h in hashes:
            blocks[h] = None
            blocks.move_to_end(h)
        while len(blocks) > self.max_blocks:
            blocks.popitem(last=False)

    def forget(self, replica: Hashable) -> None:
        """The replica is gone (or restarted: its cache is empty)."""
        self._blocks.pop(replica, None)

    def keep_only(self, replicas: Iterable[Hashable]) -> None:
        live = set(replicas)
        for replica in [r for r in self._blocks if r not in live]:
            del self._blocks[replica]

    def size(self, replica: Hashable) -> int:
        return len(self._blocks.get(replica, ()))
