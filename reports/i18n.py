"""The report's one message catalogue: every piece of prose, in English and Spanish.

Messages live in `messages_<lang>.json` beside this module (flat keys such as "findings.title",
values with `{name}` placeholders filled by `str.format`). Both catalogues hold the same keys with
the same placeholders (tests/test_reports.py checks it). Scientific names stay recognisable in
Spanish: the English term follows the Spanish one ("cabezas de inducción (induction heads)").

    from headlens.reports.i18n import t
    t("viewer.cut", "es", total=300, shown=64)
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from importlib import resources

from headlens.reports.languages import DEFAULT_LANG, LANGS, check_lang


@lru_cache(maxsize=len(LANGS))
def catalogue(lang: str) -> dict[str, str]:
    """Every message of one language: {key: text with {placeholders}}."""
    check_lang(lang)
    path = resources.files("headlens.reports") / f"messages_{lang}.json"
    return json.loads(path.read_text(encoding="utf-8"))


def t(key: str, lang: str = DEFAULT_LANG, **values) -> str:
    """The message `key` in `lang`, placeholders filled from `values`. KeyError for an unknown key."""
    text = catalogue(lang)[key]
    return text.format(**values) if values else text


def has(key: str, lang: str = DEFAULT_LANG) -> bool:
    """Whether the catalogue has `key` (optional messages such as column headings)."""
    return key in catalogue(lang)


# One number convention per language: English writes 462,464 and 0.96; Spanish writes 462 464 (a no-break
# space between thousands, so it cannot be read as a decimal) and 0,96 (RAE, Ortografía 2010, § 8.2.2.1).
DECIMAL_MARK = {"en": ".", "es": ","}
THOUSANDS_MARK = {"en": ",", "es": "\u00a0"}


def _localize(text: str, lang: str) -> str:
    """A number written the English way ("1,234.5") in `lang`'s convention."""
    return text.replace(",", "\0").replace(".", DECIMAL_MARK[lang]).replace("\0", THOUSANDS_MARK[lang])


def number(value: float, lang: str = DEFAULT_LANG, digits: int = 2) -> str:
    """A decimal number with `digits` decimals as that language writes it (Spanish: decimal comma)."""
    return _localize(f"{value:,.{digits}f}", lang)


def short_number(value: float, lang: str = DEFAULT_LANG, spec: str = "g") -> str:
    """A number in the shortest form `spec` gives ("0.4", "2.384e-07"), in `lang`'s convention."""
    return _localize(f"{value:{spec}}", lang)


# Powers of ten as superscripts: 2.6 × 10⁻⁷ reads the same in both languages (no "e-07").
SUPERSCRIPT = str.maketrans("-0123456789", "\u207b\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079")
# Numbers whose magnitude is within [10^SMALL_EXPONENT, 10^LARGE_EXPONENT) are written out; others as powers of ten.
SMALL_EXPONENT, LARGE_EXPONENT = -3, 15


def significant(value: float, lang: str = DEFAULT_LANG, digits: int = 3) -> str:
    """`value` to `digits` significant figures, the one style of a table's numbers: written out ("0.997",
    "0.000432", "12.3", "1,234,567") between 0.001 and 10^15, else as a power of ten ("2.65 × 10⁻⁷")."""
    if not math.isfinite(value):
        return str(value)
    if value == 0:
        return "0"
    exponent = math.floor(math.log10(abs(value)))
    if abs(round(value, digits - 1 - exponent)) >= 10 ** (exponent + 1):  # 0.9996 -> 1.00: one more place
        exponent += 1
    if SMALL_EXPONENT <= exponent < LARGE_EXPONENT:
        decimals = max(0, digits - 1 - exponent)
        rounded = round(value, decimals)
        if decimals == 0:
            return integer(int(rounded), lang)
        whole, _, fraction = f"{rounded:.{decimals}f}".partition(".")
        return _signed(whole, lang) + DECIMAL_MARK[lang] + fraction
    mantissa = short_number(value / 10**exponent, lang, f".{digits - 1}f")
    return f"{mantissa} \u00d7 10{str(exponent).translate(SUPERSCRIPT)}"


def _signed(whole: str, lang: str) -> str:
    """The integer part of a written-out number with `lang`'s grouping ("-0" kept for a small negative)."""
    sign = "-" if whole.startswith("-") else ""
    return sign + integer(abs(int(whole)), lang)


def quantity(value: float, lang: str = DEFAULT_LANG) -> str:
    """A measured quantity (a score, nats, logits, a probability, a p-value) as every part of the page writes it,
    prose, tables and the page script alike (viewer_core.js `num`): significant(value, lang, 3)."""
    return significant(float(value), lang, 3)


def percent(share: float, lang: str = DEFAULT_LANG) -> str:
    """A share as a percentage to 3 significant figures at most ("5%", "91.7%"), "5 %" in Spanish (a no-break
    space before the sign)."""
    shown = significant(100 * share, lang, 3)
    if DECIMAL_MARK[lang] in shown:  # 5.00 -> 5, 12.50 -> 12.5: a percentage without trailing zeros
        shown = shown.rstrip("0").rstrip(DECIMAL_MARK[lang])
    return shown + ("%" if lang == "en" else "\u00a0%")


def integer(value: int, lang: str = DEFAULT_LANG) -> str:
    """A whole number with `lang`'s thousands separator (Spanish groups only numbers of 5 digits or more)."""
    if lang == "es" and abs(int(value)) < 10_000:
        return str(int(value))
    return _localize(f"{int(value):,}", lang)


def column_heading(column: str, lang: str = DEFAULT_LANG) -> str:
    """A table column's heading: its catalogue entry ("col.<name>") or the column's own name."""
    key = f"col.{column}"
    return t(key, lang) if has(key, lang) else str(column)


def js_messages(lang: str = DEFAULT_LANG) -> dict[str, str]:
    """The messages the page script shows (keys "js.*"), embedded as JSON for report.js."""
    return {key[3:]: text for key, text in catalogue(lang).items() if key.startswith("js.")}
