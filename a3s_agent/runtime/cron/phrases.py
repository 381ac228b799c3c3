"""The simple English schedules A3S's clients may send instead of a cron expression ("every day at
9am", "every 15 minutes", "every monday and friday at 17:30", "@daily"), turned into one.

The forms, case and spacing aside (a leading "run" and a trailing period are ignored):

- `@hourly`, `@daily` (`@midnight`), `@weekly`, `@monthly`, `@yearly` (`@annually`)
- `every minute`, `every N minutes`, `every hour` (`hourly`), `every N hours`
- `every day` (`daily`), `every N days`, `every weekday`, `every weekend`, `every week` (`weekly`,
  on Sunday), `every monday` (`every mon`, `mondays`, `on mondays`), a list of days (`every monday,
  wednesday and friday`), `every month` (`monthly`, on the 1st) or `every month on the 15th`,
  `every year` (`yearly`, `annually`, on January 1st): each at midnight unless `at TIME` follows or
  comes first, TIME being `9am`, `9:30 pm`, `21:00`, `noon` or `midnight`.
"""

from __future__ import annotations

import re

from ...base.errors import InvalidArgument

NICKNAMES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
DAYS = ("sunday", "monday", "tuesday", "wednesday", "thursday", "friday", "saturday")
EXAMPLES = "'every 15 minutes', 'every day at 9am', 'every monday at 08:30', 'every month on the 1st'"

_TIME = re.compile(r"(?:(\d{1,2})(?::(\d{2}))?\s*(am|pm)?|(noon|midnight))")
_AT = re.compile(rf"(?:^|\s)at\s+{_TIME.pattern}(?=\s|$)")
_EVERY_N = re.compile(r"every\s+(\d+)\s+(minute|hour|day)s?")
_MONTHLY = re.compile(r"(?:every\s+month|monthly)(?:\s+on\s+(?:the\s+|day\s+)?(\d{1,2})(?:st|nd|rd|th)?)?")
_DAY_LIST = re.compile(r"(?:every\s+|on\s+)?([a-z]+(?:\s*(?:,|and)\s*[a-z]+)*)")
_SIMPLE = {
    "every minute": "* * * * *",
    "every hour": "0 * * * *",
    "hourly": "0 * * * *",
}
_DAILY = {  # forms taking a time: their day-of-month, month and day-of-week fields
    "every day": "* * *",
    "daily": "* * *",
    "every weekday": "* * 1-5",
    "weekdays": "* * 1-5",
    "every weekend": "* * 0,6",
    "weekends": "* * 0,6",
    "every week": "* * 0",
    "weekly": "* * 0",
    "every year": "1 1 *",
    "yearly": "1 1 *",
    "annually": "1 1 *",
}


def cron_expression(text: str, field: str) -> str | None:
    """The cron expression a phrase stands for; None when `text` is no phrase of the forms above.
    InvalidArgument (naming `field`) for a phrase with a number out of range."""
    phrase = " ".join(text.lower().strip().rstrip(".").split())
    phrase = phrase.removeprefix("run ")
    if phrase in NICKNAMES:
        return NICKNAMES[phrase]
    if phrase in _SIMPLE:
        return _SIMPLE[phrase]
    minute, hour, rest = 0, 0, phrase
    at = _AT.search(phrase)
    if at is not None:
        hour, minute = _clock_time(at, text, field)
        rest = (phrase[: at.start()] + " " + phrase[at.end() :]).strip()
    days = _days(rest, text, field)
    if days is not None:
        return f"{minute} {hour} {days}"
    every = _EVERY_N.fullmatch(rest)
    if every is not None:
        return _every(int(every[1]), every[2], minute, hour, text, field, timed=at is not None)
    return None


def _days(rest: str, text: str, field: str) -> str | None:
    """The last three fields of a form that runs on some days; None for other forms."""
    if rest in _DAILY:
        return _DAILY[rest]
    monthly = _MONTHLY.fullmatch(rest)
    if monthly is not None:
        day = int(monthly[1] or 1)
        if not 1 <= day <= 31:
            raise InvalidArgument(f"{field} {text!r}: a month has no day {day} (1-31)")
        return f"{day} * *"
    listed = _DAY_LIST.fullmatch(rest)
    if listed is None:
        return None
    numbers = set()
    for name in filter(None, re.split(r"\s*(?:,|and)\s*", listed[1])):
        number = _weekday(name)
        if number is None:
            return None
        numbers.add(number)
    return "* * " + ",".join(str(n) for n in sorted(numbers))


def _weekday(name: str) -> int | None:
    """0 (Sunday) to 6 for a day's name, its first three letters, or either with an s (mondays)."""
    word = name[:-1] if name.endswith("s") and name[:-1] in (*DAYS, *(d[:3] for d in DAYS)) else name
    for number, day in enumerate(DAYS):
        if word in (day, day[:3]):
            return number
    return None


def _every(
    count: int, unit: str, minute: int, hour: int, text: str, field: str, *, timed: bool
) -> str | None:
    limits = {"minute": 59, "hour": 23, "day": 31}
    if not 1 <= count <= limits[unit]:
        raise InvalidArgument(f"{field} {text!r}: every {count} {unit}s: the count must be 1-{limits[unit]}")
    if unit == "minute":
        return None if timed else ("* * * * *" if count == 1 else f"*/{count} * * * *")
    if unit == "hour":
        return None if timed else ("0 * * * *" if count == 1 else f"0 */{count} * * *")
    return f"{minute} {hour} {'*' if count == 1 else f'*/{count}'} * *"


def _clock_time(found: re.Match[str], text: str, field: str) -> tuple[int, int]:
    """(hour, minute) of an `at TIME` clause."""
    hours, minutes, half, word = found.groups()
    if word is not None:
        return (12 if word == "noon" else 0), 0
    hour, minute = int(hours), int(minutes or 0)
    if half is not None:
        if not 1 <= hour <= 12:
            raise InvalidArgument(f"{field} {text!r}: {hour}{half} is not a time (1-12 before am or pm)")
        hour = hour % 12 + (12 if half == "pm" else 0)
    if hour > 23 or minute > 59:
        raise InvalidArgument(
            f"{field} {text!r}: {hours}:{minutes or '00'} is not a time of day (00:00-23:59)"
        )
    return hour, minute
