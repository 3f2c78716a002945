"""Verbalisers of dates and times.

Dates: DD/MM/YYYY by default (India), MM/DD only when the day cannot be a month (08/15/2025);
ISO 2025-08-15; "15 Aug 2025", "15th of August", "Aug 15, 2025", "अगस्त 2025". English says
"fifteenth of August twenty twenty-five", Hindi "पंद्रह अगस्त दो हज़ार पच्चीस".
Times: English "ten thirty a m"; Hindi in quarters where people use them (सवा दस, साढ़े दस,
पौने ग्यारह, डेढ़, ढाई) and "दस बजकर बीस मिनट" otherwise, with सुबह/दोपहर/शाम/रात from am/pm
or from a 24-hour clock.
"""

from __future__ import annotations

import calendar
import re

from pipecat_veena.normalize import numbers as nw
from pipecat_veena.normalize.tables import MONTH_NAMES, MONTHS, WORDS, nfc

#: Clock period words, Hindi: (first hour, last hour, word) on a 24-hour clock.
HI_DAY_PERIODS = (
    (0, 3, "रात"),
    (4, 11, "सुबह"),
    (12, 15, "दोपहर"),
    (16, 19, "शाम"),
    (20, 23, "रात"),
)


def _month(written: str) -> int:
    return MONTHS.get(nfc(written)) or MONTHS[written]


def _year(written: str | None, lang: str) -> str:
    if not written:
        return ""
    value = int(written)
    if len(written) == 2:  # 05/08/25: say what is written
        return nw.cardinal(value, lang) if written[0] != "0" else nw.digits(written, lang)
    return nw.year(value, lang)


def _days_in(month: int, year: str | None) -> int:
    """Days of ``month`` (1-12) in the year as written (2 digits: 20xx; None: a leap year)."""
    full = 2000 if not year else int(year) + (2000 if len(year) == 2 else 0)
    return calendar.monthrange(full, month)[1]


def say_date(day: int, month: int, year: str | None, lang: str, *, month_first: bool = False,
             comma: bool = False) -> str | None:  # fmt: skip
    """A calendar date in words; None when it is not a day of the calendar (31/02, 29/02/2023).

    Args:
        day: 1-31 (up to the month's length; 29 February only in a leap year or with no year).
        month: 1-12.
        year: the year as written (2 or 4 digits), or None.
        lang: "hi" or "en".
        month_first: English "August fifteenth" (as written) instead of "fifteenth of August".
        comma: keep the comma the text had before the year (English, month first).
    """
    if not (1 <= month <= 12 and 1 <= day <= _days_in(month, year)):
        return None
    name = MONTH_NAMES[lang][month - 1]
    spoken_year = _year(year, lang)
    if lang == "hi":
        out = f"{nw.cardinal(day, 'hi')} {name}"
    elif month_first:
        out = f"{name} {nw.ordinal_en(day)}" + ("," if comma and spoken_year else "")
    else:
        out = f"{nw.ordinal_en(day)} of {name}"
    return f"{out} {spoken_year}" if spoken_year else out


def date_numeric(m: re.Match, lang: str) -> str | None:
    """05/08/2025, 15-08-2025, 15.08.2025 (day first); 08/15/2025 when 15 cannot be a month."""
    if m["dn_sep"] == "." and len(m["dn_y"]) == 2:
        return None  # 1.2.34 is a version number
    a, b = int(m["dn_a"]), int(m["dn_b"])
    day, month = (b, a) if b > 12 and a <= 12 else (a, b)
    spoken = say_date(day, month, m["dn_y"], lang)
    if spoken is None and m["dn_sep"] == "/":  # 31/02/2024, 45/13/2020: not a date; as written
        slash = f" {WORDS[lang]['slash']} "
        parts = (m["dn_a"], m["dn_b"], m["dn_y"])
        return slash.join(nw.digits(p, lang) if p[0] == "0" else nw.cardinal(int(p), lang)
                          for p in parts)  # fmt: skip
    return spoken


def date_iso(m: re.Match, lang: str) -> str | None:
    """2025-08-15."""
    return say_date(int(m["di_d"]), int(m["di_m"]), m["di_y"], lang)


def date_day_month(m: re.Match, lang: str) -> str | None:
    """15 Aug 2025, 15th of August, 5 अगस्त 1947."""
    return say_date(int(m["dt_d"]), _month(m["dt_m"]), m["dt_y"], lang)


def date_month_day(m: re.Match, lang: str) -> str | None:
    """Aug 15, 2025 and August 15th (a Hindi sentence says पंद्रह अगस्त)."""
    return say_date(
        int(m["dm_d"]), _month(m["dm_m"]), m["dm_y"], lang, month_first=True, comma=bool(m["dm_c"])
    )


def month_year(m: re.Match, lang: str) -> str:
    """August 2025 / अगस्त 2025."""
    return f"{MONTH_NAMES[lang][_month(m['my_m']) - 1]} {_year(m['my_y'], lang)}"


def _hi_period(hour24: int) -> str:
    return next(word for lo, hi, word in HI_DAY_PERIODS if lo <= hour24 <= hi)


def _hi_clock(hour12: int, minute: int) -> str:
    """साढ़े दस बजे, सवा दस बजे, पौने ग्यारह बजे, डेढ़ बजे, दस बजकर बीस मिनट."""
    nxt = hour12 % 12 + 1
    if minute == 0:
        return f"{nw.cardinal(hour12, 'hi')} बजे"
    if minute == 30:
        return {1: "डेढ़ बजे", 2: "ढाई बजे"}.get(hour12) or f"साढ़े {nw.cardinal(hour12, 'hi')} बजे"
    if minute == 15:
        return f"सवा {nw.cardinal(hour12, 'hi')} बजे"
    if minute == 45:
        return f"पौने {nw.cardinal(nxt, 'hi')} बजे"
    return f"{nw.cardinal(hour12, 'hi')} बजकर {nw.cardinal(minute, 'hi')} मिनट"


def say_time(
    hour: int, minute: int, second: int | None, ampm: str | None, lang: str, *, period: bool = True
) -> str:
    """A clock time in words.

    Args:
        hour: 0-23.
        minute: 0-59.
        second: 0-59 or None.
        ampm: "a" or "p" when the text said so.
        lang: "hi" or "en".
        period: Hindi: say सुबह/दोपहर/शाम/रात (False when the text already does).
    """
    if lang == "hi":
        hour24 = hour
        if ampm == "p" and hour < 12:
            hour24 = hour + 12
        elif ampm == "a" and hour == 12:
            hour24 = 0
        hour12 = hour24 % 12 or 12
        needed = period and (ampm or hour24 >= 13 or hour24 == 0)
        period_word = f"{_hi_period(hour24)} " if needed else ""
        if second:
            clock = f"{nw.cardinal(hour12, 'hi')} बजकर {nw.cardinal(minute, 'hi')} मिनट"
            return f"{period_word}{clock} {nw.cardinal(second, 'hi')} सेकंड"
        return period_word + _hi_clock(hour12, minute)
    out = nw.cardinal(hour, "en")
    if minute == 0 and not second:
        if ampm:
            pass
        elif 1 <= hour <= 12:
            out += " o'clock"
        else:
            out += " hundred hours"
    elif minute < 10:
        out += f" oh {nw.cardinal(minute, 'en')}"
    else:
        out += f" {nw.cardinal(minute, 'en')}"
    if second:
        out += f" and {nw.cardinal(second, 'en')} second" + ("s" if second != 1 else "")
    if ampm:
        out += f" {ampm} m"
    return out


_PERIOD_BEFORE = re.compile(r"(?:सुबह|दोपहर|शाम|रात)\s*(?:को\s*)?$")


def _said_period(m: re.Match) -> bool:
    return bool(_PERIOD_BEFORE.search(m.string[max(0, m.start() - 12) : m.start()]))


def _ampm(written: str | None) -> str | None:
    return written[0].lower() if written else None


def _keep_final_dot(m: re.Match, written: str | None, spoken: str) -> str:
    """Keep the full stop of "9 a.m." when it also ended the sentence."""
    if written and written.endswith(".") and not m.string[m.end() :].strip():
        return spoken + "."
    return spoken


def clock_time(m: re.Match, lang: str) -> str | None:
    """10:30, 10:30 am, 10.30 pm, 10:30 बजे, 18:45, 10:30:15."""
    if m["t_sep"] == "." and not (m["t_ap"] or m["t_bj"]):
        return None  # 10.30 alone is a decimal
    hour, minute = int(m["t_h"]), int(m["t_m"])
    ampm = _ampm(m["t_ap"])
    if ampm and not 1 <= hour <= 12:
        return None
    second = int(m["t_s"]) if m["t_s"] else None
    spoken = say_time(hour, minute, second, ampm, lang, period=not _said_period(m))
    return _keep_final_dot(m, m["t_ap"], spoken)


def hour_ampm(m: re.Match, lang: str) -> str:
    """9 am, 9pm, 11 a.m."""
    spoken = say_time(int(m["ta_h"]), 0, None, _ampm(m["ta_ap"]), lang, period=not _said_period(m))
    return _keep_final_dot(m, m["ta_ap"], spoken)
