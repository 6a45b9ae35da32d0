"""The evaluation's task files, made on this machine from what every machine has: JSONL data and
lm-eval task YAMLs reading it (`dataset_path: json`, so nothing is fetched).

    arbor_stdlib_ppl    loglikelihood_rolling over the module docstrings of Python's standard
                        library (read from its source with `ast`, never imported): word and byte
                        perplexity, bits per byte
    arbor_stdlib_mc     multiple choice: which module a docstring's first sentence describes,
                        against three other modules, picked with a fixed seed: acc, acc_norm
    arbor_arithmetic    generate_until: word problems with known answers (a fixed seed), three
                        worked examples before each, greedy, exact match on the first number

The docstrings are the Python Software Foundation's (PSF license); they are read from the local
installation at run time and nothing of them ships with Arbor. Another Python version has other
docstrings, so compare runs made with the same interpreter (its version goes into the results).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import random
import sys
from dataclasses import dataclass
from pathlib import Path

PPL_TASK, MC_TASK, ARITHMETIC_TASK = "arbor_stdlib_ppl", "arbor_stdlib_mc", "arbor_arithmetic"
TASKS = (PPL_TASK, MC_TASK, ARITHMETIC_TASK)
MIN_DOCSTRING_CHARS = 200
MAX_DOCSTRING_CHARS = 2000  # a window or two of the default model's context, not more
SKIPPED_MODULES = frozenset({"antigravity", "this"})  # jokes, not documentation
NUM_CHOICES = 4
ARITHMETIC_EXAMPLES = 3  # worked examples before each question


@dataclass(frozen=True, slots=True)
class TaskFiles:
    folder: Path
    tasks: tuple[str, ...]
    num_items: dict[str, int]


def write_tasks(folder: Path, num_items: int, seed: int = 0) -> TaskFiles:
    """Each task's JSONL (at most `num_items` items) and YAML into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    docs = stdlib_docstrings()
    rows = {
        PPL_TASK: [{"text": text} for _, text in spread(docs, num_items)],
        MC_TASK: module_choice_items(docs, num_items, seed),
        ARITHMETIC_TASK: arithmetic_items(num_items, seed),
    }
    for task, items in rows.items():
        data = folder / f"{task}.jsonl"
        data.write_text("".join(json.dumps(item) + "\n" for item in items))
        (folder / f"{task}.yaml").write_text(_YAMLS[task].format(data=json.dumps(str(data.resolve()))))
    return TaskFiles(folder, TASKS, {task: len(items) for task, items in rows.items()})


def stdlib_docstrings() -> list[tuple[str, str]]:
    """(module, docstring) of the public standard-library modules with a substantial one, by name."""
    found = []
    for name in sorted(sys.stdlib_module_names):
        if name.startswith("_") or name in SKIPPED_MODULES:
            continue
        text = _module_docstring(name)
        if text is not None and len(text) >= MIN_DOCSTRING_CHARS:
            found.append((name, text[:MAX_DOCSTRING_CHARS]))
    return found


def spread(docs: list[tuple[str, str]], num_items: int) -> list[tuple[str, str]]:
    """`num_items` of them evenly through the alphabet, not the first few letters' modules."""
    step = max(len(docs) // max(num_items, 1), 1)
    return docs[::step][:num_items]


def _module_docstring(name: str) -> str | None:
    try:
        spec = importlib.util.find_spec(name)  # a top-level name: located, not imported
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return None  # built in, or a C extension: no source
    try:
        tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    docstring = ast.get_docstring(tree)
    return docstring.strip() if docstring else None


def module_choice_items(docs: list[tuple[str, str]], num_items: int, seed: int) -> list[dict]:
    """'Which module ...?' with the docstring's first sentence; the module among three others."""
    rng = random.Random(seed)
    names = [name for name, _ in docs]
    items = []
    for name, text in spread(docs, num_items):
        summary = " ".join(text.split("\n\n")[0].split())
        others = rng.sample([other for other in names if other != name], NUM_CHOICES - 1)
        gold = rng.randrange(NUM_CHOICES)
        choices = [*others[:gold], name, *others[gold:]]
        question = f'Documentation: "{summary}"\nQuestion: Which Python module is documented here?\nAnswer:'
        items.append({"question": question, "choices": choices, "gold": gold})
    return items


_ARITHMETIC_FORMS = (
    ("{name} has {a} apples and buys {b} more. How many apples does {name} have now?", lambda a, b: a + b),
    ("{name} has {a} marbles and gives {b} away. How many marbles does {name} have left?", lambda a, b: a - b),
    ("{name} buys {a} boxes with {b} pens in each. How many pens does {name} have?", lambda a, b: a * b),
)
_NAMES = ("Ann", "Ben", "Cleo", "Dev", "Eva", "Farid", "Gus", "Hana")


def arithmetic_items(num_items: int, seed: int) -> list[dict]:
    """Word problems with their answers; each question opens with worked examples (the same
    examples for every item, so the items differ only in their question)."""
    rng = random.Random(seed + 1)
    problems = [_problem(rng) for _ in range(num_items + ARITHMETIC_EXAMPLES)]
    shots = "".join(
        f"Question: {question}\nAnswer: {answer}\n\n" for question, answer in problems[:ARITHMETIC_EXAMPLES]
    )
    return [
        {"question": f"{shots}Question: {question}\nAnswer:", "answer": str(answer)}
        for question, answer in problems[ARITHMETIC_EXAMPLES:]
    ]


def _problem(rng: random.Random) -> tuple[str, int]:
    form, solve = rng.choice(_ARITHMETIC_FORMS)
    a, b = rng.randint(2, 20), rng.randint(2, 9)
    if solve(a, b) < 0:
        a, b = b, a
    return form.format(name=rng.choice(_NAMES), a=a, b=b), solve(a, b)


_DATA = """dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
"""

_YAMLS = {
    PPL_TASK: f"task: {PPL_TASK}\n"
    + _DATA
    + """output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: text
should_decontaminate: false
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
metadata:
  version: 1.0
""",
    MC_TASK: f"task: {MC_TASK}\n"
    + _DATA
    + """output_type: multiple_choice
doc_to_text: question
doc_to_choice: choices
doc_to_target: gold
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
""",
    ARITHMETIC_TASK: f"task: {ARITHMETIC_TASK}\n"
    + _DATA
    + """output_type: generate_until
doc_to_text: question
doc_to_target: answer
target_delimiter: " "
generation_kwargs:
  until: ["\\n", "Question:"]
  max_gen_toks: 8
  do_sample: false
  temperature: 0.0
filter_list:
  - name: first_number
    filter:
      - function: regex
        regex_pattern: "(-?[0-9]+)"
        group_select: 0
      - function: take_first
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
""",
}
