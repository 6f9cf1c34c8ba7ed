"""Prompts for self-distillation when none are given: one template set per Spec-Bench-like category (writing,
roleplay, QA, summary, extraction, RAG, translation, coding, math, reasoning), filled from small word lists with a
seeded generator, so `python -m specviz train` without --data has a fixed, varied prompt set."""
from __future__ import annotations

import itertools
import random

TOPICS = [
    "photosynthesis", "the water cycle", "black holes", "the French Revolution", "machine learning",
    "climate change", "the human immune system", "volcanoes", "the stock market", "renewable energy",
    "ancient Rome", "the internet", "coral reefs", "vaccines", "the solar system", "honey bees",
    "the printing press", "electric cars", "sleep", "coffee", "the Great Wall of China", "rainforests",
    "earthquakes", "democracy", "inflation", "DNA", "the moon landing", "jazz music", "chess",
    "the Olympic Games", "recycling", "antibiotics", "bridges", "glaciers", "the Renaissance",
    "social media", "deserts", "electricity", "the human heart", "tea", "robots", "bread baking",
    "public libraries", "migratory birds", "solar panels", "the Silk Road", "octopuses", "volunteering",
    "gardening", "cryptography", "marathon running", "space telescopes", "urban parks", "wind turbines",
]
PEOPLE = ["a student", "a nurse", "a software engineer", "a teacher", "a chef", "a farmer", "a retired pilot",
          "a small business owner", "a librarian", "a museum guide", "a travel blogger", "a new parent"]
WRITING = [
    "Write a short story about {person} who discovers something surprising about {topic}.",
    "Write a persuasive paragraph on why people should learn about {topic}.",
    "Write a haiku and then a four-line poem about {topic}.",
    "Write a friendly email from {person} inviting a colleague to a talk on {topic}.",
    "Write a blog post introduction about {topic} for beginners.",
    "Draft a product description for a board game themed around {topic}.",
    "Write a diary entry of {person} spending a day learning about {topic}.",
    "Write a speech opening for a school assembly about {topic}.",
]
ROLEPLAY = [
    "Pretend you are {person}. Explain to a child what {topic} is.",
    "You are a tour guide. Give a lively two-minute talk about {topic}.",
    "Act as a job interviewer and ask me three questions about {topic}, then explain what a good answer includes.",
    "Imagine you are a radio host introducing a guest who is an expert on {topic}.",
]
QA = [
    "What is {topic}? Explain it in simple terms.",
    "Give five interesting facts about {topic}.",
    "What are the main advantages and disadvantages of {topic}?",
    "How has {topic} changed over the last hundred years?",
    "Why does {topic} matter for everyday life?",
    "What are common misconceptions about {topic}?",
    "Explain {topic} to {person} in three short paragraphs.",
    "List the key terms someone should know about {topic}, with one-line definitions.",
]
SUMMARY = [
    "Summarize the following text in two sentences:\n{passage}",
    "Give three bullet points that capture the main ideas of this passage:\n{passage}",
    "Write a one-sentence headline for this paragraph:\n{passage}",
]
EXTRACTION = [
    "From the text below, list every number mentioned and what it refers to.\n{passage}",
    "Extract the main subject and two supporting details from this passage as JSON:\n{passage}",
]
RAG = [
    "Use the context to answer the question.\nContext: {passage}\nQuestion: What is the passage mainly about?",
    "Context: {passage}\nBased only on the context above, what happened first?",
    "Read the document and answer briefly.\nDocument: {passage}\nQuestion: Who benefits according to the document?",
]
PASSAGE_FACTS = [
    "In {year}, the town of {town} opened a new center devoted to {topic}. About {n} people visited in the "
    "first month, and the organizers plan to double the space by {year2}.",
    "A survey of {n} residents of {town} found that most of them wanted to learn more about {topic}. The "
    "city council answered by funding evening classes starting in {year}.",
    "Researchers in {town} spent {k} years studying {topic}. Their report, published in {year}, suggests "
    "that small changes in daily habits can make a large difference.",
]
TOWNS = ["Riverton", "Maple Falls", "Oakridge", "Port Elena", "Greenfield", "Lakeside", "Stonebridge", "Westhaven"]
TRANSLATION = [
    "Translate into French: \"{sentence}\"",
    "Translate into Spanish: \"{sentence}\"",
    "Translate into German: \"{sentence}\"",
    "Translate this sentence into English: \"{foreign}\"",
]
SENTENCES = [
    "The library opens at nine in the morning.", "My brother likes to cook pasta on Sundays.",
    "We will travel to the mountains next summer.", "Please close the window when it rains.",
    "The children are playing in the garden.", "This book is more interesting than the film.",
    "I have lived in this city for ten years.", "Can you tell me where the train station is?",
    "The weather was cold but the sky was clear.", "She finished her homework before dinner.",
]
FOREIGN = ["Je voudrais un café, s'il vous plaît.", "¿Dónde está la biblioteca?", "Ich habe heute keine Zeit.",
           "Il fait très beau aujourd'hui.", "Me gusta leer por la noche.", "Wir gehen morgen ins Kino."]
CODING = [
    "Write a Python function that {task}.",
    "Write a Python function that {task}, and add a short docstring and an example.",
    "Explain step by step how to write a program that {task}.",
    "Write a JavaScript function that {task}.",
]
TASKS = [
    "reverses a string", "checks whether a number is prime", "counts the vowels in a sentence",
    "returns the n-th Fibonacci number", "merges two sorted lists", "finds the largest element in a list",
    "removes duplicates from a list while keeping order", "converts Celsius to Fahrenheit",
    "checks whether a word is a palindrome", "computes the factorial of n", "sums the digits of an integer",
    "sorts a list of dictionaries by a key", "counts word frequencies in a text", "flattens a nested list",
    "computes the average of a list of numbers", "finds the second smallest number in a list",
]
MATH = [
    "A shop sells pencils at {a} cents each. How much do {b} pencils cost? Show your steps.",
    "What is {a} times {b}? Explain how you computed it.",
    "A train travels {a} kilometers in {c} hours. What is its average speed?",
    "If a rectangle has sides {a} cm and {b} cm, what are its area and perimeter?",
    "Solve for x: {c}x + {a} = {b}. Show each step.",
    "Tom has {a} apples and gives away {c}. Then he buys {b} more. How many apples does he have now?",
    "What is {c} percent of {b}? Explain the calculation.",
    "A class has {a} students and {c} of them are absent. What fraction of the class is present?",
]
REASONING = [
    "If all {x} are {y} and some {y} are green, can we conclude that some {x} are green? Explain.",
    "Anna is taller than Ben, and Ben is taller than Carl. Who is the shortest? Explain your reasoning.",
    "I have {c} boxes and each box holds {a} balls. If I remove {b} balls, how many are left? Think step by step.",
    "Which is heavier, a kilogram of {x} or a kilogram of {y}? Explain.",
]
THINGS = ["cats", "birds", "cars", "stones", "feathers", "books", "apples", "robots"]


def _passage(rng: random.Random, topic: str) -> str:
    year = rng.randint(1990, 2022)
    return rng.choice(PASSAGE_FACTS).format(year=year, year2=year + rng.randint(2, 8), town=rng.choice(TOWNS),
                                            n=rng.randint(120, 9000), k=rng.randint(2, 12), topic=topic)


def default_prompts(n: int = 2400, seed: int = 0) -> list[str]:
    """n distinct prompts across writing, roleplay, QA, summarization, extraction, retrieval-style QA,
    translation, coding, math and reasoning, in a fixed pseudo-random order."""
    rng = random.Random(seed)
    kinds = ["writing", "roleplay", "qa", "summary", "extraction", "rag", "translation", "coding", "math", "reasoning"]
    out: list[str] = []
    seen: set[str] = set()
    for kind in itertools.cycle(kinds):
        if len(out) >= n:
            break
        topic, person = rng.choice(TOPICS), rng.choice(PEOPLE)
        a, b, c = rng.randint(3, 99), rng.randint(3, 99), rng.randint(2, 9)
        x, y = rng.sample(THINGS, 2)
        template = {"writing": WRITING, "roleplay": ROLEPLAY, "qa": QA, "summary": SUMMARY, "extraction": EXTRACTION,
                    "rag": RAG, "translation": TRANSLATION, "coding": CODING, "math": MATH,
                    "reasoning": REASONING}[kind]
        prompt = rng.choice(template).format(
            topic=topic, person=person, passage=_passage(rng, topic), sentence=rng.choice(SENTENCES),
            foreign=rng.choice(FOREIGN), task=rng.choice(TASKS), a=a, b=b, c=c, x=x, y=y)
        if prompt not in seen:
            seen.add(prompt)
            out.append(prompt)
    return out
