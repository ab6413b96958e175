"""multi_hop: lookups that chain through a directory of fictional people.

The world is a directory of ~24 generated people. Each person has relation fields whose
value is another person's name (manager, mentor, best_friend, ...) and attribute fields
(city, employer, birth_year, ...). A question chains relations:

    "What is the city of the mentor of the manager of Alice Varga?"

The model must look up Alice Varga's manager, then that person's mentor, then that
person's city: one `lookup` per hop, each taking the name the previous one returned.
The facts live only in the world, so the prompt alone cannot answer the question.

Generation guarantees that make skipping or misordering hops fail: the people on the
path are all distinct, and the asked attribute of every earlier person on the path (and
of the person reached by following the relations in reverse order) differs from the
gold answer. Some people get near-duplicate names ("Alice Varga" / "Alice Varwick") so
a model must copy names exactly.

Defaults (provisional; a later issue calibrates on a GPU): hops=2 (three dependent
lookups), n_people=24, n_relations=3, n_attributes=4, n_similar=4. Three chained calls
with names copied between them is within reach of a small instruction-tuned model but
easy to fumble (wrong relation order, stopping after one hop, mangled names), so an
untrained 0.6B-1.7B model should land in the weak-but-not-hopeless range. Attribute
pools have >= 20 values each, so guessing without tools scores about 5% or less.

Knob `inline` (default False; the same knob name in every family): the question itself
carries the directory rows it needs, one line per person written as possessive facts
("Ann Lee's mentor is Bo Park; Ann Lee's city is Velmora."), under a "Directory:" header,
then "Question: ..." and a one-line reply format with one sentence per lookup, the first
naming the start and its relation (one hop: "Reply with one sentence per step, like \"Ann
Lee's mentor is <name>. <name>'s ... is ...\", then the final line 'Answer: <value>' (the
value alone)."; each further hop adds "<name>'s ... is <name>."). The fact phrasing makes
each step the model writes ("Bo Park's city is") occur verbatim in the directory, which a
0.5B model can follow where it cannot follow "name: field = value" rows (Qwen2.5-Coder-0.5B,
one hop, first turn: 0/10 with those rows, 4/10 with these); without one sentence per hop in
the format it stops after the first hop. Rows shown: everyone when n_people <= INLINE_ROWS,
else the chain's people, then people whose names share a first name or surname with them
(the n_similar distractors), then other people, up to max(INLINE_ROWS, hops + 4) rows, in
directory order: a few distractors keep the model reading names while the prompt stays
short (Qwen tokens: about 200 with 2 fields per person, 340 with 4, 550 with the default 7).
World, question, gold answer and tools are exactly those of the non-inline example drawn
from the same rng state (the rows are picked with a private rng seeded from the query, so
inline never shifts the main rng); the eval format's system prompt says the directory is in
the question and the tools are optional. inline=False is the tools-only setting, unchanged.
"""

from __future__ import annotations

import random
import re
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ait.contract import EvalFormat, ToolParam, ToolSpec
from ait.families.base import Example, Family, InlineDifficulty, ToolCall

# The tools are the stdlib-only module every workspace gets as task_tools.py: one source for the
# hidden eval and the jobs.
from ait.job.task_tools.multi_hop import MAX_SEARCH_RESULTS, make_tools

RELATIONS = ["manager", "mentor", "best_friend", "neighbor", "dentist"]
ATTRIBUTES: dict[str, list[str]] = {
    "city": ["Port Aldren", "Velmora", "Quillhaven", "Ostbrook", "Karsvale", "Lindmere", "Thornwick",
             "Harrowgate", "Brisk Hollow", "Saltmarsh", "Eldoria", "Fenwick Bay", "Corvale", "Dunmarrow",
             "Ashcombe", "Riverend", "Glimmerton", "Northfold", "Pellmoor", "Westerly", "Zanthe", "Yarrowby"],
    "employer": ["Brightwell Labs", "Corvid Systems", "Halden & Pike", "Lumen Freight", "Marrow Bank",
                 "Northstar Bakery", "Oakridge Clinic", "Pinecone Media", "Quarry Tech", "Redfern Motors",
                 "Saltline Shipping", "Tidewater Energy", "Umber Studios", "Vantage Foods", "Willow Insurance",
                 "Yellowpine Games", "Zephyr Airlines", "Granite Law", "Ember Robotics", "Foxglove Books"],
    "birth_year": [str(y) for y in range(1950, 2005)],
    "favourite_color": ["teal", "crimson", "amber", "lavender", "olive", "navy", "coral", "mustard", "indigo",
                        "maroon", "turquoise", "ochre", "lilac", "charcoal", "peach", "emerald", "scarlet",
                        "ivory", "cobalt", "magenta", "saffron", "mint"],
    "pet": ["ferret", "parrot", "tortoise", "goldfish", "hamster", "iguana", "rabbit", "beagle", "tabby cat",
            "gecko", "canary", "hedgehog", "chinchilla", "corgi", "axolotl", "cockatiel", "poodle", "guinea pig",
            "python", "husky", "alpaca"],
    "hobby": ["rock climbing", "pottery", "chess", "birdwatching", "fencing", "knitting", "sailing", "archery",
              "origami", "beekeeping", "calligraphy", "kayaking", "juggling", "gardening", "woodcarving",
              "astronomy", "salsa dancing", "fly fishing", "bouldering", "quilting", "geocaching"],
    "instrument": ["cello", "oboe", "banjo", "harp", "trumpet", "ukulele", "accordion", "bassoon", "clarinet",
                   "drums", "flute", "harmonica", "mandolin", "piano", "saxophone", "sitar", "trombone", "tuba",
                   "viola", "violin", "xylophone"],
    "favourite_food": ["lasagna", "sushi", "paella", "ramen", "falafel", "goulash", "tacos", "risotto", "pierogi",
                       "curry", "dumplings", "moussaka", "gnocchi", "pho", "burrito", "ceviche", "shakshuka",
                       "biryani", "empanadas", "fondue", "kimchi stew"],
}
FIRST_NAMES = ["Alice", "Bram", "Cora", "Dmitri", "Elena", "Farid", "Greta", "Hugo", "Ines", "Jonas", "Kira",
               "Luca", "Mira", "Nadia", "Oskar", "Priya", "Quentin", "Rosa", "Soren", "Tamsin", "Umar", "Vera",
               "Wendel", "Xenia", "Yusuf", "Zara", "Anika", "Basil", "Celia", "Dario", "Edith", "Felix", "Gideon",
               "Hana", "Ivo", "Juno", "Kofi", "Lena", "Milo", "Nora", "Otto", "Pia", "Rafael", "Sana", "Tobias",
               "Ulla", "Viktor", "Wren", "Yara", "Zeno"]
SURNAME_HEADS = ["Var", "Kel", "Dor", "Mal", "Or", "Bren", "Tal", "Ost", "Quin", "Hal", "Zor", "Fen", "Lun",
                 "Cas", "Ith", "Rav", "Sel", "Yor", "Wen", "Drav", "Pell", "Thorn", "Ask", "Mor"]
SURNAME_TAILS = ["ga", "wick", "dane", "orin", "ell", "mont", "ova", "ard", "ley", "berg", "ani", "ette",
                 "holm", "ez", "ko", "ridge", "lin", "ask", "urn", "ady"]
TEMPLATES = ("nested", "follow", "possessive")
SYSTEM_PROMPT = (
    "You answer questions about people in a directory, using the lookup tool. "
    "Questions chain relations: look up one field per call, starting from the named "
    "person, and use the name each lookup returns as the name in the next lookup. "
    "When done, reply with the final line 'Answer: <value>'."
)
INLINE_SYSTEM_PROMPT = (
    "You answer questions about people in a directory. The question lists the directory entries you "
    "need, one line per person, so answer from those lines directly (the tools read the same directory "
    "and are optional). Questions chain relations: start at the named person's line, read the asked "
    "field to get the next person's name, go to that person's line, and repeat. End with the final "
    "line 'Answer: <value>'."
)
ANSWER_RE = re.compile(r"answer\s*[:=]\s*(.*)", re.IGNORECASE)
INLINE_ROWS = 6
"""Inline prompts show every person up to this many, else the chain plus distractors up to max(this, hops + 4)."""
INLINE_TRAILER = "Reply with one sentence per step, like \"{steps}\", then the final line 'Answer: <value>' (the value alone)."
"""The reply format: one sentence per lookup, the first naming the start and its relation, e.g. for two hops
"Ann Lee's mentor is <name>. <name>'s ... is <name>. <name>'s ... is ..." (the hop count, not the later fields)."""


class MultiHopDifficulty(InlineDifficulty):
    model_config = ConfigDict(extra="forbid")

    hops: int = Field(default=2, ge=1, le=6)
    """Relations followed before the final attribute lookup (tool calls needed = hops + 1)."""
    n_people: int = Field(default=24, ge=6, le=80)
    """People in the directory."""
    n_relations: int = Field(default=3, ge=1, le=len(RELATIONS))
    """Relation fields per person (values are other people's names)."""
    n_attributes: int = Field(default=4, ge=1, le=len(ATTRIBUTES))
    """Attribute fields per person (the question asks for one of them)."""
    n_similar: int = Field(default=4, ge=0, le=40)
    """People whose names are near-duplicates of another person's name (distractors)."""
    inline: bool = False
    """True: the question itself lists the directory rows needed (the chain's people plus a few
    distractors, one line per person) and the system prompt says so; the tools stay available
    (optional) and the gold answer is unchanged. False: the directory lives only behind the tools.
    Left out of model_dump() when False, so existing task specs and hidden-set seeds are unchanged."""


    @model_validator(mode="after")
    def _sizes(self) -> "MultiHopDifficulty":
        if self.n_people < self.hops + 3:
            raise ValueError("n_people must be at least hops + 3 (the path visits hops + 1 distinct people)")
        if self.n_similar > self.n_people // 2:
            raise ValueError("n_similar must be at most n_people // 2")
        return self


def display(field: str) -> str:
    """'best_friend' -> 'best friend' (how fields are written in prompts)."""
    return field.replace("_", " ")


def normalize_answer(text: str) -> str:
    """Case, hyphens/underscores, punctuation and whitespace-insensitive form of an answer."""
    text = re.sub(r"[_\-]", " ", text.casefold())
    text = re.sub(r"[^\w\s]", "", text)
    return " ".join(text.split())


def generate_names(rng: random.Random, n: int, n_similar: int) -> list[str]:
    """n distinct (case-insensitively) generated names; n_similar of them near-duplicate another."""
    names: list[str] = []
    keys: set[str] = set()

    def add(name: str) -> bool:
        if name.casefold() in keys:
            return False
        keys.add(name.casefold())
        names.append(name)
        return True

    while len(names) < n - n_similar:
        add(f"{rng.choice(FIRST_NAMES)} {rng.choice(SURNAME_HEADS)}{rng.choice(SURNAME_TAILS)}")
    base = list(names)
    while len(names) < n:
        first, surname = rng.choice(base).split(" ")
        head = next(h for h in sorted(SURNAME_HEADS, key=len, reverse=True) if surname.startswith(h))
        if rng.random() < 0.5:  # same first name, surname with the same head: "Alice Varga" / "Alice Varwick"
            add(f"{first} {head}{rng.choice(SURNAME_TAILS)}")
        else:  # same surname, first name with the same initial: "Alice Varga" / "Anika Varga"
            add(f"{rng.choice([f for f in FIRST_NAMES if f[0] == first[0]])} {surname}")
    rng.shuffle(names)
    return names


def generate_world(rng: random.Random, d: MultiHopDifficulty) -> dict[str, Any]:
    relations = rng.sample(RELATIONS, d.n_relations)
    attributes = rng.sample(list(ATTRIBUTES), d.n_attributes)
    names = generate_names(rng, d.n_people, d.n_similar)
    people: dict[str, dict[str, str]] = {}
    for name in names:
        row = {r: rng.choice([o for o in names if o != name]) for r in relations}
        row.update({a: rng.choice(ATTRIBUTES[a]) for a in attributes})
        people[name] = row
    return {"people": people, "fields": relations + attributes}


def follow(people: dict[str, dict[str, str]], start: str, relations: list[str]) -> list[str]:
    path = [start]
    for r in relations:
        path.append(people[path[-1]][r])
    return path


def render_prompt(template: str, start: str, relations: list[str], attribute: str) -> str:
    rels = [display(r) for r in relations]
    attr = display(attribute)
    if template == "nested":
        inner = " of the ".join(reversed(rels))
        return f"What is the {attr} of the {inner} of {start}?"
    if template == "follow":
        steps = ", then ".join(["their " + rels[0]] + [f"that person's {r}" for r in rels[1:]])
        return f"Start from {start}. Follow {steps}. What is the {attr} of the person you reach?"
    if template == "possessive":
        chain = "'s ".join([start] + rels + [attr])
        return f"What is {chain}?"
    raise ValueError(f"unknown template {template!r}")


def similar_names(name: str, other: str) -> bool:
    """Whether two different names share a first name or a surname (the near-duplicates of generate_names)."""
    a, b = name.split(" "), other.split(" ")
    return name != other and (a[0] == b[0] or a[1] == b[1])


def inline_rows(people: dict[str, dict[str, str]], query: dict[str, Any]) -> list[str]:
    """The names whose rows an inline prompt shows, in directory order (see the module docstring)."""
    names = list(people)
    if len(names) <= INLINE_ROWS:
        return names
    path = follow(people, query["start"], query["relations"])
    cap = max(INLINE_ROWS, len(path) + 3)
    local = random.Random("|".join([query["start"], *query["relations"], query["attribute"], str(len(names))]))
    rest = [n for n in names if n not in path]
    local.shuffle(rest)
    similar = [n for n in rest if any(similar_names(n, p) for p in path)]
    others = [n for n in rest if n not in similar]
    chosen = set(path + (similar + others)[: cap - len(path)])
    return [n for n in names if n in chosen]


def render_row(name: str, row: dict[str, str], fields: list[str]) -> str:
    """One person's line as possessive facts: "Ann Lee's mentor is Bo Park; Ann Lee's city is Velmora."
    The name is repeated per field so that a step written as "Bo Park's city is" occurs verbatim."""
    return "; ".join(f"{name}'s {display(f)} is {row[f]}" for f in fields) + "."


def render_inline(question: str, world: dict[str, Any]) -> str:
    people, fields, query = world["people"], world["fields"], world["query"]
    shown = inline_rows(people, query)
    header = "Directory:" if len(shown) == len(people) else "Directory (the entries you need):"
    rows = "\n".join(render_row(n, people[n], fields) for n in shown)
    first = f"{query['start']}'s {display(query['relations'][0])} is <name>."
    steps = " ".join([first] + ["<name>'s ... is <name>."] * (len(query["relations"]) - 1) + ["<name>'s ... is ..."])
    trailer = INLINE_TRAILER.format(steps=steps)
    return f"{header}\n{rows}\n\nQuestion: {question}\n{trailer}"


class MultiHop(Family):
    name = "multi_hop"
    calibrated = {"hops": 1, "n_people": 8, "n_relations": 2, "n_attributes": 2, "n_similar": 0,
                  "inline": True}  # Qwen2.5-Coder-0.5B 0.255, n=200 (H200, 2026-11-30)
    description = (
        "Multi-hop lookups in a directory of fictional people: a question chains relations "
        "('the city of the mentor of the manager of Alice Varga'). The model must call the "
        "lookup tool once per hop, feeding each returned name into the next lookup in the right "
        "order, then report the final field value."
    )
    Difficulty = MultiHopDifficulty

    def example(self, rng: random.Random, difficulty: BaseModel) -> Example:
        d = MultiHopDifficulty.model_validate(difficulty.model_dump())
        for _ in range(1000):  # a world almost always yields a valid question within a few tries
            world = generate_world(rng, d)
            people = world["people"]
            n_rel = d.n_relations
            relations_pool, attributes = world["fields"][:n_rel], world["fields"][n_rel:]
            for _ in range(50):
                start = rng.choice(list(people))
                relations = [rng.choice(relations_pool) for _ in range(d.hops)]
                attribute = rng.choice(attributes)
                path = follow(people, start, relations)
                if len(set(path)) != len(path):
                    continue
                answer = people[path[-1]][attribute]
                # skipping hops, or following the relations in reverse order, must not give the answer
                shortcuts = [people[p][attribute] for p in path[:-1]]
                if relations != relations[::-1]:
                    shortcuts.append(people[follow(people, start, relations[::-1])[-1]][attribute])
                if answer in shortcuts:
                    continue
                template = rng.choice(TEMPLATES)
                world["query"] = {"start": start, "relations": relations, "attribute": attribute}
                prompt = render_prompt(template, start, relations, attribute)
                if d.inline:
                    prompt = render_inline(prompt, world)
                return Example(prompt=prompt, world=world, answer=normalize_answer(answer))
        raise RuntimeError(f"multi_hop: no valid question found at difficulty {d.model_dump()}")

    def tools(self, world: dict[str, Any]) -> list[Callable[..., str]]:
        return make_tools(world)

    def score(self, response: str, answer: str) -> float:
        matches = ANSWER_RE.findall(response or "")
        if not matches:
            return 0.0
        got = normalize_answer(matches[-1])
        return 1.0 if got and got == normalize_answer(answer) else 0.0

    def gold_trace(self, example: Example) -> list[ToolCall]:
        q = example.world["query"]
        path = follow(example.world["people"], q["start"], q["relations"])
        calls = [ToolCall(name="lookup", arguments={"name": p, "field": r}) for p, r in zip(path, q["relations"])]
        calls.append(ToolCall(name="lookup", arguments={"name": path[-1], "field": q["attribute"]}))
        return calls

    def eval_format(self, difficulty: BaseModel) -> EvalFormat:
        d = MultiHopDifficulty.model_validate(difficulty.model_dump())
        return EvalFormat(
            system_prompt=INLINE_SYSTEM_PROMPT if d.inline else SYSTEM_PROMPT,
            tools=[
                ToolSpec(
                    name="lookup",
                    description="Read one field of one person: returns the value as text (relation fields "
                    "such as manager return another person's full name). Names match case-insensitively; "
                    "errors start with 'error:' and list valid fields or similar names.",
                    parameters=[
                        ToolParam(name="name", type="string", description="the person's full name"),
                        ToolParam(name="field", type="string",
                                  description="the field to read, e.g. 'manager' or 'city'"),
                    ],
                    returns="the field's value as text",
                    example={"name": "Alice Varga", "field": "city"},
                ),
                ToolSpec(
                    name="search",
                    description="List people whose first name, surname or full name starts with a prefix "
                    f"(up to {MAX_SEARCH_RESULTS} full names separated by '; ').",
                    parameters=[ToolParam(name="name_prefix", type="string",
                                          description="the start of a name, e.g. 'Ali'")],
                    returns="matching full names, or an 'error:' line",
                    example={"name_prefix": "A"},
                ),
            ],
            answer_format="The last line of the final reply is 'Answer: <value>', e.g. 'Answer: Port Aldren'.",
            max_turns=d.hops + 3,
            max_new_tokens=128,
        )
