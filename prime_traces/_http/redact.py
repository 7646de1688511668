"""Hiding the API key in every text the packages emit: exception messages, log lines, CLI errors.

The key is found by token, never as a substring of words: a short key (or
form of it, see :func:`_key_forms`) counts only where no key character
(letter, digit, ``-`` or ``_``) touches it on either side, so a one-letter key
``e`` hides ``Bearer e`` but leaves ``stopped`` alone. A form of
:data:`_ANYWHERE_LEN` characters or more is hidden wherever it occurs, glued
to other text too (``Bearer%20<key>``): no word is that long a piece of a
key by chance. Besides the key, any bearer credential is hidden: the value of
an ``Authorization: Bearer`` header whatever it is, and a ``Bearer`` token
elsewhere when it looks like a credential (a digit or one of ``-_~+/=`` in
it), which leaves prose such as "Bearer token expired" readable.

Usage::

    hide = Redactor(config.api_key)
    hide("HTTP 400: you sent Authorization: Bearer pk-123")  # '... Bearer <redacted>'
    redact(message, api_key)                                 # the same, for one text
"""

from __future__ import annotations

import re

REDACTED = "<redacted>"

#: Characters a key token is made of: a key occurrence touching one is part of a longer word.
_KEY_CHAR = r"[A-Za-z0-9_\-]"
#: Whitespace and control characters: where a key with stray characters may be split.
_STRAY = re.compile(r"[\s\x00-\x1f\x7f-\x9f]+")
#: Shorter pieces of a split key are too likely to match unrelated text to be worth hiding.
_MIN_PIECE = 8
#: Forms this long are hidden even inside a longer word.
_ANYWHERE_LEN = 16
#: What a credential after ``Bearer`` is made of; ``<`` excluded so ``Bearer <redacted>`` stays as it is.
_TOKEN_CHAR = r"[^\s\"'<>,;()\[\]{}]"
_HEADER_BEARER = re.compile(rf"(?i)(\bauthorization\b[\"'\s:=]*bearer\s+){_TOKEN_CHAR}+")
_LOOSE_BEARER = re.compile(rf"(?i)(\bbearer\s+)(?={_TOKEN_CHAR}*?[0-9_~+/=\-]){_TOKEN_CHAR}+")


class Redactor:
    """Hides one API key, and any bearer credential, in texts; built once per key, thread-safe."""

    def __init__(self, api_key: str | None) -> None:
        forms = _key_forms(api_key or "")
        anywhere = [re.escape(form) for form in forms if len(form) >= _ANYWHERE_LEN]
        short = [re.escape(form) for form in forms if len(form) < _ANYWHERE_LEN]
        if short:
            anywhere.append(rf"(?<!{_KEY_CHAR})(?:{'|'.join(short)})(?!{_KEY_CHAR})")
        self._key = re.compile("|".join(anywhere)) if anywhere else None

    def __call__(self, text: str) -> str:
        return self.subn(text)[0]

    def subn(self, text: str) -> tuple[str, bool]:
        """``text`` redacted, and whether the key itself (not only a bearer credential) was in it."""
        found = False
        if self._key is not None:
            text, count = self._key.subn(REDACTED, text)
            found = count > 0
        text = _HEADER_BEARER.sub(rf"\g<1>{REDACTED}", text)
        text = _LOOSE_BEARER.sub(rf"\g<1>{REDACTED}", text)
        return text, found

    def exception_chain(self, err: BaseException) -> None:
        """Redact the string arguments of ``err`` and of every exception it wraps, in place.

        Tracebacks and ``exc_info`` logs print the chained third-party
        exceptions too. requests wraps urllib3's exceptions both as arguments
        and as causes; non-string arguments are kept, since callers inspect
        them (see ``_transport.not_sent``).
        """
        seen: set[int] = set()
        pending: list[BaseException] = [err]
        while pending:
            current = pending.pop()
            if id(current) in seen:
                continue
            seen.add(id(current))
            current.args = tuple(self(a) if isinstance(a, str) else a for a in current.args)
            pending.extend(a for a in current.args if isinstance(a, BaseException))
            pending.extend(e for e in (current.__cause__, current.__context__) if e is not None)


def redact(text: str, api_key: str | None = None) -> str:
    """``text`` with ``api_key`` (as a whole token) and any bearer credential replaced by ``<redacted>``."""
    return Redactor(api_key)(text)


def _key_forms(key: str) -> tuple[str, ...]:
    """Every form in which ``key`` may be quoted by a third-party message, longest first.

    Besides the key itself: its ``str`` and ``bytes`` reprs (requests and
    http.client quote header values with ``%r``, which turns a stray newline
    into ``\\n``), and, for a key with stray characters inside, each long
    piece between them, in case a library quotes the header in parts.
    """
    if not key:
        return ()
    forms = {key, key.strip(), repr(key)[1:-1], ascii(key)[1:-1]}
    for encoding in ("utf-8", "latin-1"):
        try:
            forms.add(repr(key.encode(encoding))[2:-1])
        except UnicodeEncodeError:
            pass  # a key that has no bytes in this encoding cannot be quoted in it either
    forms.update(piece for piece in _STRAY.split(key) if len(piece) >= _MIN_PIECE)
    return tuple(sorted((form for form in forms if form), key=len, reverse=True))
