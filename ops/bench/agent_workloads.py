"""`arbor bench agent`'s workloads: multi-turn conversations generated from a seed. Torch-free.

Three kinds, each the traffic an agent sends:

- `tools`: a travel desk. Three tools are declared; the first three turns force one call each
  (`tool_choice` names the function, so even a small model writes a well-formed call), the bench
  answers each call with a JSON result, and a last turn (`tool_choice: "none"`) answers in text.
- `extract`: many similar order records, one per user turn, each answered under
  `response_format: json_schema` with the same schema, the earlier answers kept in the history.
- `code`: an edit loop over two files. Forced `read_file`, `replace_in_file`, `read_file`, then a
  text answer; the file contents come back in the tool results (after an edit, the edited file).
  The files are excerpts of the Python standard library's own sources, read from this machine.

What is generated here and what the model writes: the system prompts, user turns, tool
declarations, schemas, records, file excerpts and every tool result are generated from the seed;
every assistant turn (the calls' arguments, the JSON answers, the text answers) is the model's
own output, sent back in the history as the model wrote it. Tool results depend on the model's
arguments only within the values the schemas allow (an `enum` of cities or paths), so the
conversation stays well-formed whatever the model writes; a call whose arguments do not parse
gets a result for the first allowed value. Greedy decoding is lossless under every speculation
mode, so each mode replays the same conversations.
"""

from __future__ import annotations

import json
import random
import re
import sysconfig
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

WORKLOADS = ("tools", "extract", "code")

CITIES = ["Lisbon", "Porto", "Madrid", "Paris", "Berlin", "Rome", "Vienna", "Prague", "Oslo", "Dublin"]
CURRENCIES = ["EUR", "USD", "GBP", "CHF", "NOK"]
SKIES = ["sunny", "cloudy", "rain", "showers", "wind"]
NAMES = ["Ana Silva", "Jonas Berg", "Marta Costa", "Luca Bianchi", "Eva Novak", "Sean Byrne", "Ines Ruiz"]
# Small, stable modules of the standard library: their sources are the code workload's files.
STDLIB_FILES = [
    "textwrap.py",
    "shlex.py",
    "fnmatch.py",
    "bisect.py",
    "heapq.py",
    "string.py",
    "colorsys.py",
    "glob.py",
    "queue.py",
    "calendar.py",
    "difflib.py",
    "numbers.py",
    "contextlib.py",
    "functools.py",
    "csv.py",
    "sched.py",
    "graphlib.py",
    "statistics.py",
    "fractions.py",
    "copy.py",
]


@dataclass(slots=True, frozen=True)
class WorkloadSizes:
    call_tokens: int = 192  # max_tokens of a forced tool call
    answer_tokens: int = 96  # max_tokens of a text answer
    extract_tokens: int = 160  # max_tokens of a JSON answer
    records: int = 6  # user turns of an extraction conversation
    file_chars: int = 1500  # characters of each file excerpt


@dataclass(slots=True, frozen=True)
class Turn:
    """One request: an optional user message added first, then the request's own settings."""

    user: str | None
    max_tokens: int
    tool_choice: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None


@dataclass(slots=True)
class Conversation:
    workload: str
    index: int
    system: str
    turns: list[Turn]
    tools: list[dict[str, Any]] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)  # path -> contents (code): edited as the replay goes
    seed: str = ""

    def fresh(self) -> Conversation:
        """A copy to replay: the code workload's edits land in the copy's files."""
        return replace(self, files=dict(self.files))

    def first_messages(self) -> list[dict[str, Any]]:
        return [{"role": "system", "content": self.system}]

    def tool_result(self, name: str, arguments: str) -> str:
        """What the bench's tool returns for the model's call (module docstring)."""
        args = _parsed(arguments)
        if self.workload == "code":
            return _file_tool(self.files, name, args)
        return _travel_tool(random.Random(f"{self.seed}/{name}/{arguments}"), name, args)


def conversations(workloads: list[str], count: int, seed: int, sizes: WorkloadSizes) -> list[Conversation]:
    """`count` conversations, the workloads taking turns; conversation i is the same for any count."""
    unknown = [name for name in workloads if name not in WORKLOADS]
    assert workloads and not unknown, unknown
    builders = {"tools": travel_conversation, "extract": extraction_conversation, "code": code_conversation}
    return [builders[workloads[i % len(workloads)]](i, seed, sizes) for i in range(count)]


def forced(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name}}


def _function(name: str, description: str, properties: dict[str, Any]) -> dict[str, Any]:
    parameters = {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


# --- tools: the travel desk -------------------------------------------------------------------

TRAVEL_TOOLS = [
    _function(
        "get_weather",
        "Daily forecast for a city.",
        {"city": {"type": "string", "enum": CITIES}, "days": {"type": "integer", "minimum": 1, "maximum": 5}},
    ),
    _function(
        "search_flights",
        "Direct flights between two cities on a date (YYYY-MM-DD).",
        {
            "origin": {"type": "string", "enum": CITIES},
            "destination": {"type": "string", "enum": CITIES},
            "date": {"type": "string", "pattern": "^2027-0[1-9]-[0-2][0-9]$"},
        },
    ),
    _function(
        "convert_currency",
        "Convert an amount between currencies at today's rate.",
        {
            "amount": {"type": "integer", "minimum": 1, "maximum": 10000},
            "source": {"type": "string", "enum": CURRENCIES},
            "target": {"type": "string", "enum": CURRENCIES},
        },
    ),
]


def travel_conversation(index: int, seed: int, sizes: WorkloadSizes) -> Conversation:
    rng = random.Random(f"{seed}/tools/{index}")
    origin, destination = rng.sample(CITIES, 2)
    date = f"2027-0{rng.randint(1, 9)}-{rng.randint(10, 28)}"
    days, amount = rng.randint(2, 5), rng.randrange(50, 2000, 10)
    source, target = rng.sample(CURRENCIES, 2)
    user = (
        f"I fly from {origin} to {destination} on {date}. Check the weather in {destination} for the next "
        f"{days} days, find a flight, and tell me what {amount} {source} is in {target}. Then give me a "
        "short plan for the trip."
    )
    calls = [Turn(user, sizes.call_tokens, forced("get_weather"))]
    calls += [Turn(None, sizes.call_tokens, forced(name)) for name in ("search_flights", "convert_currency")]
    system = "You are a travel assistant. Use the tools to answer; quote their results exactly."
    answer = Turn(None, sizes.answer_tokens, "none")
    return Conversation("tools", index, system, [*calls, answer], TRAVEL_TOOLS, seed=f"{seed}/tools/{index}")


def _travel_tool(rng: random.Random, name: str, args: dict[str, Any]) -> str:
    if name == "get_weather":
        city, days = _choice(args.get("city"), CITIES), _bounded(args.get("days"), 1, 5)
        forecast = [
            {"day": day + 1, "high_c": rng.randint(12, 31), "low_c": rng.randint(2, 12), "sky": rng.choice(SKIES)}
            for day in range(days)
        ]
        return _json({"city": city, "unit": "celsius", "forecast": forecast})
    if name == "search_flights":
        origin, destination = _choice(args.get("origin"), CITIES), _choice(args.get("destination"), CITIES)
        flights = [_flight(rng, origin, destination) for _ in range(rng.randint(2, 4))]
        return _json({"origin": origin, "destination": destination, "date": args.get("date"), "flights": flights})
    if name == "convert_currency":
        amount = _bounded(args.get("amount"), 1, 10000)
        rate = round(rng.uniform(0.5, 1.5), 4)
        source, target = _choice(args.get("source"), CURRENCIES), _choice(args.get("target"), CURRENCIES)
        return _json(
            {"amount": amount, "source": source, "target": target, "rate": rate, "result": round(amount * rate, 2)}
        )
    return _json({"error": f"unknown tool {name!r}"})


def _flight(rng: random.Random, origin: str, destination: str) -> dict[str, Any]:
    hour, minutes = rng.randint(6, 21), rng.choice([0, 15, 30, 45])
    number = f"{origin[:2].upper()}{destination[:1].upper()}{rng.randint(100, 999)}"
    depart = f"{hour:02d}:{minutes:02d}"
    return {"flight": number, "depart": depart, "duration_min": rng.randint(60, 240), "price_eur": rng.randint(39, 420)}


# --- extract: orders under a JSON schema ------------------------------------------------------

ORDER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "order_id": {"type": "integer", "minimum": 1000, "maximum": 99999},
        "customer": {"type": "string", "maxLength": 32},
        "city": {"type": "string", "enum": CITIES},
        "currency": {"type": "string", "enum": CURRENCIES},
        "paid": {"type": "boolean"},
        "items": {
            "type": "array",
            "minItems": 1,
            "maxItems": 3,
            "items": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string", "maxLength": 10},
                    "quantity": {"type": "integer", "minimum": 1, "maximum": 99},
                    "unit_price_cents": {"type": "integer", "minimum": 1, "maximum": 99999},
                },
                "required": ["sku", "quantity", "unit_price_cents"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["order_id", "customer", "city", "currency", "paid", "items"],
    "additionalProperties": False,
}
ORDER_FORMAT = {"type": "json_schema", "json_schema": {"name": "order", "schema": ORDER_SCHEMA, "strict": True}}


def extraction_conversation(index: int, seed: int, sizes: WorkloadSizes) -> Conversation:
    rng = random.Random(f"{seed}/extract/{index}")
    system = (
        "Extract each order the user pastes into JSON with the fields order_id, customer, city, "
        "currency, paid and items (sku, quantity, unit_price_cents). Answer with the JSON only."
    )
    turns = [Turn(order_record(rng), sizes.extract_tokens, response_format=ORDER_FORMAT) for _ in range(sizes.records)]
    return Conversation("extract", index, system, turns, seed=f"{seed}/extract/{index}")


def order_record(rng: random.Random) -> str:
    items = [
        f"{rng.randint(1, 12)} x SKU-{rng.randint(1000, 9999)} at {rng.randint(1, 400)}.{rng.randint(0, 99):02d}"
        for _ in range(rng.randint(1, 3))
    ]
    paid = "payment received" if rng.random() < 0.6 else "payment pending"
    return (
        f"Order #{rng.randint(1000, 99999)}, placed by {rng.choice(NAMES)} in {rng.choice(CITIES)}: "
        f"{'; '.join(items)} ({rng.choice(CURRENCIES)}), {paid}."
    )


# --- code: an edit loop over standard-library sources -----------------------------------------


def code_conversation(index: int, seed: int, sizes: WorkloadSizes) -> Conversation:
    rng = random.Random(f"{seed}/code/{index}")
    names = rng.sample(available_stdlib_files(), 2)
    files = {f"lib/{name}": stdlib_excerpt(name, rng, sizes.file_chars) for name in names}
    first, second = files
    function = _first_function(files[first])
    paths = {"type": "string", "enum": list(files)}
    tools = [
        _function("read_file", "Read a file of the repository.", {"path": paths}),
        _function(
            "replace_in_file",
            "Replace the first occurrence of `old` with `new` in a file.",
            {"path": paths, "old": {"type": "string", "maxLength": 48}, "new": {"type": "string", "maxLength": 48}},
        ),
    ]
    user = (
        f"In {first}, rename `{function}` to `{function}_v2` and update what calls it, then check whether "
        f"{second} uses it. The files are {first} and {second}."
    )
    turns = [
        Turn(user, sizes.call_tokens, forced("read_file")),
        Turn(None, sizes.call_tokens, forced("replace_in_file")),
        Turn(None, sizes.call_tokens, forced("read_file")),
        Turn(None, sizes.answer_tokens, "none"),
    ]
    system = "You are a coding agent. Read files before editing them; make the smallest edit that works."
    return Conversation("code", index, system, turns, tools, files, seed=f"{seed}/code/{index}")


def available_stdlib_files() -> list[str]:
    folder = Path(sysconfig.get_paths()["stdlib"])
    found = [name for name in STDLIB_FILES if (folder / name).is_file()]
    assert len(found) >= 2, f"fewer than two of the workload's modules in {folder}"
    return found


def stdlib_excerpt(name: str, rng: random.Random, max_chars: int) -> str:
    """Whole lines of the module's source from a random line on, at most `max_chars` characters."""
    lines = (Path(sysconfig.get_paths()["stdlib"]) / name).read_text(encoding="utf-8").splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.lstrip().startswith(("def ", "class "))] or [0]
    start = rng.choice(starts)  # a definition's first line: an excerpt an agent would be shown
    excerpt: list[str] = []
    for line in lines[start:]:
        if sum(map(len, excerpt)) + len(line) > max_chars:
            break
        excerpt.append(line)
    return "".join(excerpt) or lines[start][:max_chars]


def _first_function(text: str) -> str:
    found = re.search(r"^\s*def (\w+)", text, re.MULTILINE)
    return found.group(1) if found else "main"


def _file_tool(files: dict[str, str], name: str, args: dict[str, Any]) -> str:
    path = _choice(args.get("path"), list(files))
    if name == "read_file":
        return files[path]
    if name == "replace_in_file":
        old, new = str(args.get("old") or ""), str(args.get("new") or "")
        if old and old in files[path]:
            files[path] = files[path].replace(old, new, 1)
            return f"Replaced 1 occurrence in {path}. It now reads:\n{files[path]}"
        return f"No match for `old` in {path}; nothing changed. It reads:\n{files[path]}"
    return f"unknown tool {name!r}"


# --- small helpers ---------------------------------------------------------------------------


def _parsed(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _choice(value: object, allowed: list[str]) -> str:
    return value if isinstance(value, str) and value in allowed else allowed[0]


def _bounded(value: object, low: int, high: int) -> int:
    return min(max(value, low), high) if isinstance(value, int) and not isinstance(value, bool) else low


def _json(value: dict[str, Any]) -> str:
    return json.dumps(value, separators=(",", ":"))
