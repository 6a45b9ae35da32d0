"""The prompt mix for self-distilled drafter data at scale: chat, code, JSON and tool calls, and
multi-turn agent traffic, built on this machine from licensed offline sources only.

    chat     question templates x topics (prompts.py's, plus more topics)
    code     coding tasks x languages x request templates
    tools    a user request answered with tools in the request (function schemas written here);
             half of them ask for JSON output instead
    agent    multi-turn: system prompt with tools, a user task, the assistant's tool call, the
             tool's result, and a follow-up, as coding and support agents send them
    docs     "explain / use / test this" over the docstrings of functions and classes in Python's
             standard library (PSF license), read with `ast` from the local installation, never
             imported; module docstrings are left out (ops/eval/tasks.py evaluates on those)
    pipdocs  the same over installed pip packages' own docstrings (PIP_DOC_PACKAGES: BSD, MIT and
             Apache licensed); another version of Python or of a package gives other prompts

Every prompt has a stable key (`source/index`) and a greedy answer; every chat, tools and agent
prompt and one in two of the others is also answered sampled (T=0.7, a seed from its key). The
order is a seeded shuffle of all of them, so any prefix of the mix is itself a mix. The held-out
prompts (prompts.HELD_OUT) never appear. Torch-free.
"""

from __future__ import annotations

import ast
import importlib.util
import itertools
import json
import random
import sysconfig
import zlib
from dataclasses import dataclass
from pathlib import Path

from ops.training.prompts import CODE_TASKS, HELD_OUT, QUESTION_TEMPLATES, TOPICS

SAMPLED_TEMPERATURE = 0.7
MAX_DOC_CHARS = 1200  # keeps a docs prompt well inside the context, next to its answer
MIN_DOC_CHARS = 120
MAX_PIP_DOCS = 1600  # of ~3,600 documented names: docs stay a minority of the mix
SAMPLED_EVERY = {"chat": 1, "tools": 1, "agent": 1, "code": 2, "docs": 2, "pipdocs": 2}  # a sampled answer too
PIP_DOC_PACKAGES = ("jinja2", "click", "httpx", "starlette", "pydantic", "redis", "anyio", "packaging", "jsonschema")

MORE_TOPICS = [
    "quantum computing", "the Great Wall of China", "rainforests", "the Olympic Games", "glaciers",
    "cryptography", "the Renaissance", "solar panels", "bacteria", "the Silk Road", "tides", "origami",
    "volunteering", "public libraries", "the periodic table", "marathon training", "urban planning",
    "supply chains", "wind turbines", "the human brain", "coral reefs", "minimalism", "typography",
    "the Industrial Revolution", "nuclear fusion", "bird migration", "time zones", "open source software",
    "microplastics", "the Byzantine Empire", "meditation", "3D printing", "inflation", "the Amazon river",
    "photography", "the Cold War", "composting", "electric guitars", "the Fibonacci sequence", "pandemics",
]  # fmt: skip
MORE_QUESTION_TEMPLATES = [
    "Write a short blog post introduction about {topic}.",
    "Compare {topic} today with fifty years ago.",
    "Give me a step-by-step guide to getting started with {topic}.",
    "What questions would an expert on {topic} ask a beginner?",
    "Explain {topic} in exactly three sentences.",
]
LANGUAGES = ["Python", "JavaScript", "TypeScript", "Go", "Rust", "SQL", "Bash"]
MORE_CODE_TASKS = [
    "parse a JSON string and print a field", "compute the average of a list of numbers",
    "check if a string is a palindrome", "count word frequencies in a text", "rotate a matrix by 90 degrees",
    "find the longest common prefix of strings", "group a list of records by a key", "retry a failing call",
    "paginate through an API", "chunk a list into batches of n", "compute a moving average",
    "deduplicate records by id", "validate a date string", "convert a CSV row to a dictionary",
    "implement a stack with push and pop",
]  # fmt: skip
CODE_REQUESTS = [
    "Write a {language} function to {task}.",
    "In {language}, how do I {task}? Show code.",
    "Write {language} code to {task}, with a short explanation.",
    "Review this plan: I want to {task} in {language}. What could go wrong?",
    "Write a unit test in {language} for a function that does this: {task}.",
]
TOOLS = [
    ("get_weather", "Current weather for a city", {"city": "string", "unit": "string"}),
    ("search_web", "Search the web and return the top results", {"query": "string", "max_results": "integer"}),
    ("create_event", "Create a calendar event", {"title": "string", "date": "string", "duration_min": "integer"}),
    ("send_email", "Send an email", {"to": "string", "subject": "string", "body": "string"}),
    ("read_file", "Read a file from the workspace", {"path": "string"}),
    ("run_command", "Run a shell command in the workspace", {"command": "string", "timeout_s": "integer"}),
    ("lookup_order", "Look up an order by its id", {"order_id": "string"}),
    ("convert_currency", "Convert an amount between currencies",
     {"amount": "number", "from": "string", "to": "string"}),
]  # fmt: skip
TOOL_REQUESTS = {
    "get_weather": ["What's the weather in {place} right now?", "Do I need an umbrella in {place} today?"],
    "search_web": ["Find recent articles about {topic}.", "Search for a beginner tutorial on {topic}."],
    "create_event": ["Schedule a meeting about {topic} next Tuesday for an hour.",
                     "Add a reminder to read about {topic}."],
    "send_email": ["Email my team a summary of {topic}.", "Send Alex a note about the {topic} workshop."],
    "read_file": ["Open notes/{slug}.md and summarize it.", "What does src/{slug}.py do?"],
    "run_command": ["Run the tests for the {slug} module.", "List the files in the {slug} folder."],
    "lookup_order": ["Where is my order {number}?", "Can you check order {number} for me?"],
    "convert_currency": ["How much is {number} dollars in euros?", "Convert {number} yen to pounds."],
}  # fmt: skip
PLACES = ["Paris", "Tokyo", "Nairobi", "Lima", "Oslo", "Toronto", "Mumbai", "Sydney", "Cairo", "Denver"]
JSON_REQUESTS = [
    "Return a JSON object with the fields name, category and summary describing {topic}.",
    "List three facts about {topic} as a JSON array of strings. Reply with JSON only.",
    'Extract the key terms from this sentence as JSON {{"terms": [...]}}: "{topic} shapes how people live."',
]


@dataclass(slots=True, frozen=True)
class MixPrompt:
    key: str  # source/index, stable across runs: what a resumed run skips by
    messages: tuple[dict, ...]
    tools: tuple[dict, ...] | None
    temperature: float  # 0.0: greedy
    seed: int  # the sampled answer's seed (a function of the key)


def prompt_mix(seed: int = 0, stdlib: Path | None = None) -> list[MixPrompt]:
    """Every prompt of the mix, greedy and sampled variants, in a seeded shuffled order."""
    conversations = {
        "chat": _chat(),
        "code": _code(),
        "tools": _tool_requests(),
        "agent": _agent_sessions(),
        "docs": _docs(sorted((stdlib or Path(sysconfig.get_paths()["stdlib"])).glob("*.py"))),
        "pipdocs": _docs(pip_package_sources())[::2][:MAX_PIP_DOCS],  # every other: all packages appear
    }
    held_out = set(HELD_OUT)
    prompts = []
    for source, items in conversations.items():
        for index, (messages, tools) in enumerate(items):
            if messages[-1]["content"] in held_out:
                continue
            key = f"{source}/{index}"
            prompts.append(MixPrompt(f"{key}/greedy", tuple(messages), tools, 0.0, 0))
            if index % SAMPLED_EVERY[source] == 0:
                seed_of_key = zlib.crc32(key.encode())
                prompts.append(MixPrompt(f"{key}/t0.7", tuple(messages), tools, SAMPLED_TEMPERATURE, seed_of_key))
    random.Random(seed).shuffle(prompts)
    return prompts


Conversation = tuple[list[dict], tuple[dict, ...] | None]


def _user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def _chat() -> list[Conversation]:
    templates, topics = QUESTION_TEMPLATES + MORE_QUESTION_TEMPLATES, TOPICS + MORE_TOPICS
    return [(_user(t.format(topic=topic)), None) for t, topic in itertools.product(templates, topics)]


def _code() -> list[Conversation]:
    tasks = CODE_TASKS + MORE_CODE_TASKS
    return [
        (_user(t.format(language=language, task=task)), None)
        for t, language, task in itertools.product(CODE_REQUESTS, LANGUAGES, tasks)
    ]


def tool_schema(name: str, description: str, fields: dict[str, str]) -> dict:
    """One tool in the OpenAI request format."""
    properties = {field: {"type": kind} for field, kind in fields.items()}
    parameters = {"type": "object", "properties": properties, "required": list(fields)[:1]}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


def _tools_system(tools: tuple[dict, ...]) -> dict:
    """Tools described in the system prompt, Hermes-style, for templates that do not render `tools`
    themselves (the answers are read with the hermes parser)."""
    listing = "\n".join(json.dumps(tool["function"]) for tool in tools)
    text = (
        "You are a helpful assistant with access to these tools:\n<tools>\n"
        f"{listing}\n</tools>\nTo call a tool, reply with "
        '<tool_call>{"name": ..., "arguments": {...}}</tool_call>.'
    )
    return {"role": "system", "content": text}


def _fill(template: str, rng: random.Random) -> str:
    topic = rng.choice(TOPICS + MORE_TOPICS)
    slug = topic.split()[-1].lower()
    return template.format(place=rng.choice(PLACES), topic=topic, slug=slug, number=rng.randrange(100, 99999))


def _tool_requests() -> list[Conversation]:
    rng = random.Random(7)
    schemas = [tool_schema(*tool) for tool in TOOLS]
    items: list[Conversation] = []
    for _ in range(12):  # twelve fillings of every request, each with its tool and two others offered
        for index, requests in enumerate(TOOL_REQUESTS.values()):
            for request in requests:
                offered = (schemas[index], *rng.sample(schemas[:index] + schemas[index + 1 :], 2))
                items.append(([_tools_system(offered), *_user(_fill(request, rng))], offered))
    for template, topic in itertools.product(JSON_REQUESTS, TOPICS + MORE_TOPICS):
        items.append((_user(template.format(topic=topic)), None))
    return items


def _agent_sessions() -> list[Conversation]:
    """Multi-turn agent traffic: a task, the assistant's tool call, the tool's result, a follow-up."""
    rng = random.Random(11)
    schemas = [tool_schema(*tool) for tool in TOOLS]
    follow_ups = [
        "Thanks. Now summarize what you found in two sentences.",
        "Good. What should I do next?",
        "Can you double-check that and explain the result?",
        "Great, now write the result up as a short message to the team.",
    ]
    items: list[Conversation] = []
    for _ in range(25):
        for index, (name, requests) in enumerate(TOOL_REQUESTS.items()):
            arguments = {field: _fill("{slug}", rng) for field in list(TOOLS[index][2])[:1]}
            call = json.dumps({"name": name, "arguments": arguments})
            result = json.dumps({"status": "ok", "result": _fill("{topic} in {place}: {number}", rng)})
            messages = [
                _tools_system(tuple(schemas)),
                *_user(_fill(rng.choice(requests), rng)),
                {"role": "assistant", "content": f"<tool_call>{call}</tool_call>"},
                {"role": "tool", "content": result},
                *_user(rng.choice(follow_ups)),
            ]
            items.append((messages, tuple(schemas)))
    return items


DOC_REQUESTS = [
    "Explain what this Python function does and give an example call:\n\n{doc}",
    "Here is the documentation of `{name}`. Summarize it in plain words:\n\n{doc}",
    "Write a short usage example for `{name}`, documented as follows:\n\n{doc}",
    "What are the edge cases a test of `{name}` should cover? Its documentation:\n\n{doc}",
]


def pip_package_sources() -> list[Path]:
    """The .py files of the installed PIP_DOC_PACKAGES (found, not imported)."""
    paths: list[Path] = []
    for name in PIP_DOC_PACKAGES:
        spec = importlib.util.find_spec(name)
        for folder in (spec.submodule_search_locations or []) if spec else []:
            paths += sorted(Path(folder).rglob("*.py"))
    return paths


def _docs(paths: list[Path]) -> list[Conversation]:
    items: list[Conversation] = []
    for index, (name, doc) in enumerate(docstrings(paths)):
        template = DOC_REQUESTS[index % len(DOC_REQUESTS)]
        items.append((_user(template.format(name=name, doc=doc)), None))
    return items


def docstrings(paths: list[Path]) -> list[tuple[str, str]]:
    """(qualified name, docstring) of the documented public functions and classes in `paths`."""
    found = []
    for path in paths:
        try:
            tree = ast.parse(path.read_text(errors="ignore"))
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                continue
            doc = ast.get_docstring(node)
            if doc and len(doc) >= MIN_DOC_CHARS and not node.name.startswith("_"):
                found.append((f"{path.stem}.{node.name}", doc[:MAX_DOC_CHARS]))
    return found
