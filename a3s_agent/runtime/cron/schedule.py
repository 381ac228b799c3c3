"""A job's schedule: a 5-field cron expression (minute hour day-of-month month day-of-week), read as
Debian's cron reads one by PyPI `cronsim` (Healthchecks' parser, typed, kept up), or one of the
phrases phrases.py turns into one; its times in the operator's time zone (--cron-timezone), in ms
since the epoch; and what it means in words (cronsim's `explain`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, tzinfo

from cronsim import CronSim, CronSimError

from ...base.errors import InvalidArgument
from .phrases import EXAMPLES, cron_expression

FIELDS = ("minute", "hour", "day-of-month", "month", "day-of-week")
_RANGES = {
    "minute": "0-59",
    "hour": "0-23",
    "day-of-month": "1-31 or L",
    "month": "1-12 or JAN-DEC",
    "day-of-week": "0-7 or SUN-SAT",
}
SHAPE = "minute hour day-of-month month day-of-week"
MAX_LENGTH = 200


@dataclass(frozen=True)
class Schedule:
    expression: str
    """The 5-field cron expression, its fields separated by single spaces."""
    zone: tzinfo

    @classmethod
    def parse(cls, text: str, zone: tzinfo, field: str = "schedule") -> Schedule:
        """The schedule a cron expression or a phrase gives; InvalidArgument naming `field` and,
        for a cron expression, the field of it at fault."""
        given = text.strip()
        if not given:
            raise InvalidArgument(
                f"{field} is required: a cron expression ({SHAPE}) or a phrase such as {EXAMPLES}"
            )
        if len(given) > MAX_LENGTH:
            raise InvalidArgument(f"{field} has {len(given)} characters; at most {MAX_LENGTH}")
        expression = cron_expression(given, field) or " ".join(given.split())
        fields = expression.split(" ")
        cron_like = all(_cron_characters(f) for f in fields) and any(c in "*0123456789" for c in expression)
        if cron_like and len(fields) != len(FIELDS):
            raise InvalidArgument(
                f"{field} {given!r} has {len(fields)} fields: a cron expression has 5 ({SHAPE})"
            )
        if not cron_like:
            raise InvalidArgument(
                f"{field} {given!r} is neither a 5-field cron expression ({SHAPE}) nor a phrase this"
                f" server reads, such as {EXAMPLES}"
            )
        try:
            times = CronSim(expression, datetime.now(zone))
        except CronSimError as exc:
            raise InvalidArgument(_fault(field, given, fields, str(exc))) from None
        try:
            next(times)
        except StopIteration:
            raise InvalidArgument(f"{field} {given!r} names no time in the next 50 years") from None
        return cls(expression, zone)

    def after(self, ms: int) -> int | None:
        """The first time after `ms` (None: none in the next 50 years)."""
        return _first(CronSim(self.expression, self._at(ms)))

    def latest(self, ms: int) -> int | None:
        """The last time at or before `ms`."""
        return _first(CronSim(self.expression, self._at(ms + 1), reverse=True))

    def upcoming(self, ms: int, count: int) -> list[int]:
        times: list[int] = []
        current: int | None = ms
        while len(times) < count and current is not None:
            current = self.after(current)
            if current is not None:
                times.append(current)
        return times

    def explain(self) -> str:
        """What it means in words, e.g. "At 09:00 every day"."""
        return CronSim(self.expression, datetime.now(self.zone)).explain()

    def shown(self, ms: int) -> str:
        """A time as the description writes it: 2026-05-02 09:00 UTC."""
        return self._at(ms).strftime("%Y-%m-%d %H:%M %Z")

    def _at(self, ms: int) -> datetime:
        return datetime.fromtimestamp(ms / 1000, self.zone)


def _first(times: CronSim) -> int | None:
    try:
        return int(next(times).timestamp() * 1000)
    except StopIteration:
        return None


def _cron_characters(text: str) -> bool:
    """Whether a field is made of what cron fields are made of (digits, * / , - ? L W # and names)."""
    return all(c.isascii() and (c.isalnum() or c in "*/,-?#") for c in text)


def _fault(field: str, given: str, fields: list[str], said: str) -> str:
    """cronsim's "Bad minute" as a message naming the field, its value and what it may be."""
    name = next((n for n in FIELDS if said.lower().endswith(n)), None)
    if name is None:
        return f"{field} {given!r} is not a valid cron expression ({SHAPE}): {said}"
    value = fields[FIELDS.index(name)]
    return (
        f"{field} {given!r}: the {name} field ({FIELDS.index(name) + 1} of 5) {value!r} is not valid:"
        f" values {_RANGES[name]}, with * , - and /"
    )
