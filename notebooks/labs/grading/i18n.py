"""English and Chinese for every message of the lab grader: ``T(en, zh, **kw)`` picks one by the
language set with ``set_lang`` ('en' by default, 'zh' with ``grade.py --lang zh``) and formats it."""
from __future__ import annotations

LANGS = ("en", "zh")
_LANG = ["en"]


def set_lang(lang: str) -> None:
    if lang not in LANGS:
        raise ValueError(f"set_lang: lang must be one of {LANGS}, got {lang!r}")
    _LANG[0] = lang


def lang() -> str:
    return _LANG[0]


def T(en: str, zh: str, **kw) -> str:
    text = zh if _LANG[0] == "zh" else en
    return text.format(**kw) if kw else text
