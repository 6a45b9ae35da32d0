"""Prompts for drafter training (self-distillation) and the held-out acceptance benchmark.

Built from instruction templates crossed with topics, so the training set spans questions,
instructions, code, lists, stories and multi-turn chats without shipping a data set. The
held-out prompts are written separately and never used for training.
"""

from __future__ import annotations

import itertools
import random

TOPICS = [
    "photosynthesis",
    "the French Revolution",
    "black holes",
    "machine learning",
    "the water cycle",
    "climate change",
    "the Roman Empire",
    "volcanoes",
    "the human heart",
    "electric cars",
    "coffee",
    "the internet",
    "honey bees",
    "the moon landing",
    "chess",
    "vaccines",
    "the stock market",
    "renewable energy",
    "ancient Egypt",
    "the immune system",
    "gardening",
    "jazz music",
    "earthquakes",
    "the printing press",
    "recycling",
    "sleep",
    "the ocean",
    "dinosaurs",
    "democracy",
    "bread baking",
]
QUESTION_TEMPLATES = [
    "What is {topic}?",
    "Explain {topic} to a ten-year-old.",
    "Why is {topic} important?",
    "Give me three interesting facts about {topic}.",
    "Summarize the history of {topic} in a paragraph.",
    "What are the pros and cons of {topic}?",
    "List five key terms related to {topic} and define them.",
    "Write a short poem about {topic}.",
    "Tell me a short story that involves {topic}.",
    "How would you teach {topic} in a classroom?",
    "What are common misconceptions about {topic}?",
]
CODE_TASKS = [
    "reverse a string",
    "check if a number is prime",
    "compute the factorial of n",
    "merge two sorted lists",
    "count the words in a sentence",
    "find the maximum in a list",
    "read a CSV file and print each row",
    "compute Fibonacci numbers",
    "remove duplicates from a list",
    "sort a dictionary by value",
    "validate an email address",
    "convert Celsius to Fahrenheit",
    "flatten a nested list",
    "implement binary search",
    "count vowels in a string",
]
CODE_TEMPLATES = [
    "Write a Python function to {task}.",
    "Write a JavaScript function to {task}.",
    "Explain how to {task} in Python, with code.",
    "Write a Python function to {task} and add a docstring.",
]
MULTI_TURN = [
    [
        ("user", "Hi! Can you help me plan a trip?"),
        ("assistant", "Of course! Where would you like to go?"),
        ("user", "I am thinking about Japan in spring. What should I see?"),
    ],
    [
        ("user", "I want to learn to cook."),
        ("assistant", "Great idea! What kind of food do you enjoy?"),
        ("user", "Italian food. Where should I start?"),
    ],
    [
        ("user", "What is a list in Python?"),
        ("assistant", "A list is an ordered, mutable collection of items."),
        ("user", "How do I add an item to it?"),
    ],
    [
        ("user", "Recommend a book."),
        ("assistant", "Sure! Do you prefer fiction or non-fiction?"),
        ("user", "Fiction, something with adventure."),
    ],
    [
        ("user", "I feel stressed about exams."),
        ("assistant", "I'm sorry to hear that. When are your exams?"),
        ("user", "Next week. How should I prepare?"),
    ],
]

HELD_OUT = [
    "What causes the seasons on Earth?",
    "Write a Python function that returns the n-th triangular number.",
    "List four tips for writing a good resume.",
    "Tell me a short story about a lighthouse keeper.",
    "Explain the difference between weather and climate.",
    "How do I make a cup of tea?",
    "What are the planets of the solar system?",
    "Write a haiku about autumn leaves.",
    "Give three reasons to learn a second language.",
    "Explain what a variable is in programming.",
    "What is the capital of Australia and why was it chosen?",
    "Describe how a bicycle works.",
]


def training_conversations(seed: int = 0) -> list[list[dict]]:
    """Every training conversation (message lists ending with a user turn), shuffled reproducibly."""
    conversations = [
        [{"role": "user", "content": t.format(topic=topic)}]
        for t, topic in itertools.product(QUESTION_TEMPLATES, TOPICS)
    ]
    conversations += [
        [{"role": "user", "content": t.format(task=task)}] for t, task in itertools.product(CODE_TEMPLATES, CODE_TASKS)
    ]
    conversations += [[{"role": role, "content": text} for role, text in turns] for turns in MULTI_TURN]
    held_out = set(HELD_OUT)
    conversations = [c for c in conversations if c[-1]["content"] not in held_out]
    random.Random(seed).shuffle(conversations)
    return conversations


def held_out_conversations() -> list[list[dict]]:
    return [[{"role": "user", "content": prompt}] for prompt in HELD_OUT]
