"""multi_hop's tool interface, shipped read-only into the workspace: `import task_tools as tt`.

    SYSTEM_PROMPT           the task's system prompt (the inline one when task.json sets inline: true)
    Environment             the task's tools: lookup(name, field), search(name_prefix), reading
                            info["world"] = {"people": {name: {field: value}}, "fields": [...],
                            "query": {"start", "relations", "attribute"}}
    make_tools(world)       the same tools as plain functions over one world: the hidden eval's own
    task_difficulty()       task.json's knobs: hops, n_people, n_relations, n_attributes, n_similar, inline
    make_row(rng, d)        one row {prompt, answer, info: {"world"}} at knobs d (None if none came up);
                            unset knobs: 1-3 hops over 16-30 people
    distinct_rows(n, draw)  up to n rows with distinct prompts from draw()
    follow(people, start, relations)  the names along a chain, start first
    normalize(text)         an answer's comparable form (case, punctuation, _ and - ignored)
    parse_answer(text)      the last 'Answer: <value>', normalized, or None
    gold(answer)            the row's answer as parse_answer returns it
"""

import difflib
import json
import random
import re
from pathlib import Path

TOOLS_SYSTEM_PROMPT = (
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

RELATIONS = ["manager", "mentor", "best_friend", "neighbor", "dentist"]
ATTRIBUTES = {
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
MAX_SEARCH_RESULTS = 8
INLINE_ROWS = 6


def _key(text):
    return " ".join(text.split()).strip(" .,'\"`").casefold()


def _field_key(text):
    return _key(text).replace("-", "_").replace(" ", "_")


def normalize(text):
    text = re.sub(r"[_\-]", " ", str(text).casefold())
    text = re.sub(r"[^\w\s]", "", text)
    return " ".join(text.split())


# ---------------------------------------------------------------- tools


def make_tools(world):
    """The task's tools over one world, as plain functions: the hidden eval's own (ait.families.multi_hop
    returns these, and the eval's chat template shows their docstrings)."""
    people = world.get("people", {})
    fields = list(world.get("fields", []))
    by_key = {_key(name): name for name in people}

    def lookup(name: str, field: str) -> str:
        """Look up one field of one person in the directory.

        Args:
            name: The person's full name, e.g. "Alice Varga".
            field: The field to read, e.g. "manager" or "city".

        Returns:
            The field's value (for relation fields, another person's full name), or a line starting with "error:".
        """
        if not isinstance(name, str) or not name.strip():
            return "error: name must be a non-empty string (a person's full name)"
        if not isinstance(field, str) or not field.strip():
            return f"error: field must be a non-empty string; valid fields: {', '.join(fields)}"
        person = by_key.get(_key(name))
        if person is None:
            close = difflib.get_close_matches(_key(name), list(by_key), n=3, cutoff=0.6)
            hint = f"; similar names: {', '.join(by_key[c] for c in close)}" if close else ""
            return f"error: no person named {name.strip()[:60]!r}{hint}"
        key = _field_key(field)
        if key not in fields:
            return f"error: unknown field {field.strip()[:40]!r}; valid fields: {', '.join(fields)}"
        return people[person][key]

    def search(name_prefix: str) -> str:
        """Find people whose first name or surname starts with a prefix.

        Args:
            name_prefix: The start of a first name, surname or full name, e.g. "Ali" or "Varga".

        Returns:
            Matching full names separated by "; ", or a line starting with "error:".
        """
        if not isinstance(name_prefix, str) or not name_prefix.strip():
            return "error: name_prefix must be a non-empty string"
        prefix = _key(name_prefix)
        if not prefix:
            return "error: name_prefix must contain letters"
        hits = [name for key, name in by_key.items()
                if key.startswith(prefix) or any(w.startswith(prefix) for w in key.split())]
        if not hits:
            return f"error: no person matches {name_prefix.strip()[:60]!r}"
        hits.sort()
        more = f" (+{len(hits) - MAX_SEARCH_RESULTS} more)" if len(hits) > MAX_SEARCH_RESULTS else ""
        return "; ".join(hits[:MAX_SEARCH_RESULTS]) + more

    return [lookup, search]


class Environment:
    """make_tools' tools as methods over a row's info["world"]: what env.py's trainer calls, and the
    docstrings its prompts show."""

    def reset(self, info: dict) -> None:
        world = (info or {}).get("world") or {}
        self.people = world.get("people", {})  # the world's parts, for code that reads them
        self.fields = list(world.get("fields", []))
        self.by_key = {_key(name): name for name in self.people}
        self._tools = {fn.__name__: fn for fn in make_tools(world)}

    def _tool(self, name):
        if not hasattr(self, "_tools"):  # a tool called before reset acts on an empty world
            self.reset({})
        return self._tools[name]

    def lookup(self, name: str, field: str) -> str:
        """Look up one field of one person in the directory.

        Args:
            name: The person's full name, e.g. "Alice Varga".
            field: The field to read, e.g. "manager" or "city".
        """
        return self._tool("lookup")(name, field)

    def search(self, name_prefix: str) -> str:
        """Find people whose first name or surname starts with a prefix.

        Args:
            name_prefix: The start of a first name, surname or full name, e.g. "Ali" or "Varga".
        """
        return self._tool("search")(name_prefix)


# ---------------------------------------------------------------- dataset


def task_difficulty() -> dict:
    """The task's difficulty knobs from task.json next to this file ({} when it is not there).
    Training at another difficulty teaches the wrong problems: at an easy rung the model would
    only ever see questions it cannot answer, and learn the shaped rewards instead."""
    try:
        difficulty = json.loads(Path(__file__).with_name("task.json").read_text()).get("difficulty", {})
    except (OSError, ValueError, AttributeError):
        return {}
    return difficulty if isinstance(difficulty, dict) else {}


def _inline(difficulty):
    """Whether the task puts the directory rows in the question (task.json's `inline`; off when absent)."""
    return difficulty.get("inline") is True


SYSTEM_PROMPT = INLINE_SYSTEM_PROMPT if _inline(task_difficulty()) else TOOLS_SYSTEM_PROMPT


def _knob(difficulty, name, lo, hi):
    """An integer knob clamped to [lo, hi], or None when the task does not set it (or garbles it)."""
    try:
        return min(max(int(difficulty[name]), lo), hi)
    except (KeyError, TypeError, ValueError):
        return None


def _names(rng, n, n_similar):
    names, seen = [], set()
    while len(names) < n:
        if names and len(names) >= n - n_similar:  # a near-duplicate of an existing name
            first, surname = rng.choice(names).split(" ")
            name = f"{first} {surname[:3]}{rng.choice(SURNAME_TAILS)}"
        else:
            name = f"{rng.choice(FIRST_NAMES)} {rng.choice(SURNAME_HEADS)}{rng.choice(SURNAME_TAILS)}"
        if name.casefold() not in seen:
            seen.add(name.casefold())
            names.append(name)
    rng.shuffle(names)
    return names


def follow(people, start, relations):
    path = [start]
    for r in relations:
        path.append(people[path[-1]][r])
    return path


def _prompt(rng, start, relations, attribute):
    rels = [r.replace("_", " ") for r in relations]
    attr = attribute.replace("_", " ")
    style = rng.randrange(3)
    if style == 0:
        return f"What is the {attr} of the {' of the '.join(reversed(rels))} of {start}?"
    if style == 1:
        steps = ", then ".join(["their " + rels[0]] + [f"that person's {r}" for r in rels[1:]])
        return f"Start from {start}. Follow {steps}. What is the {attr} of the person you reach?"
    chain = "'s ".join([start] + rels + [attr])
    return f"What is {chain}?"


def _inline_prompt(question, people, fields, start, relations, attribute):
    """The question with the directory rows it needs above it (the family's inline style)."""
    names = list(people)
    shown = names
    if len(names) > INLINE_ROWS:
        path = follow(people, start, relations)
        local = random.Random("|".join([start, *relations, attribute, str(len(names))]))
        rest = [n for n in names if n not in path]
        local.shuffle(rest)
        firsts = {p.split(" ")[0] for p in path}
        lasts = {p.split(" ")[1] for p in path}
        similar = [n for n in rest if n.split(" ")[0] in firsts or n.split(" ")[1] in lasts]
        others = [n for n in rest if n not in similar]
        chosen = set(path + (similar + others)[: max(INLINE_ROWS, len(path) + 3) - len(path)])
        shown = [n for n in names if n in chosen]
    header = "Directory:" if len(shown) == len(names) else "Directory (the entries you need):"
    lines = ["; ".join(f"{n}'s {f.replace('_', ' ')} is {people[n][f]}" for f in fields) + "." for n in shown]
    steps = " ".join([f"{start}'s {relations[0].replace('_', ' ')} is <name>."]
                     + ["<name>'s ... is <name>."] * (len(relations) - 1) + ["<name>'s ... is ..."])
    trailer = f"Reply with one sentence per step, like \"{steps}\", then the final line 'Answer: <value>' (the value alone)."
    return header + "\n" + "\n".join(lines) + "\n\nQuestion: " + question + "\n" + trailer


def make_row(rng, difficulty):
    """One question at the task's knobs (the family's meaning: hops = relations followed before
    the attribute; n_people, n_relations, n_attributes, n_similar = the directory's shape);
    a knob the task leaves out keeps this env's own range. None if no valid question came up."""
    hops = _knob(difficulty, "hops", 1, 6)
    hops = rng.choice([1, 2, 2, 3]) if hops is None else hops
    n_relations = _knob(difficulty, "n_relations", 1, len(RELATIONS)) or 3
    n_attributes = _knob(difficulty, "n_attributes", 1, len(ATTRIBUTES)) or 4
    n_people = _knob(difficulty, "n_people", hops + 3, 80)
    n_similar = _knob(difficulty, "n_similar", 0, 40)
    for _ in range(20):  # a small world may have no simple path of `hops` steps: draw another
        relations_pool = rng.sample(RELATIONS, n_relations)
        attributes = rng.sample(list(ATTRIBUTES), n_attributes)
        size = rng.randint(16, 30) if n_people is None else n_people
        names = _names(rng, size, min(4 if n_similar is None else n_similar, size // 2))
        people = {}
        for name in names:
            row = {r: rng.choice([o for o in names if o != name]) for r in relations_pool}
            row.update({a: rng.choice(ATTRIBUTES[a]) for a in attributes})
            people[name] = row
        for _ in range(200):
            start = rng.choice(names)
            relations = [rng.choice(relations_pool) for _ in range(hops)]
            attribute = rng.choice(attributes)
            path = follow(people, start, relations)
            if len(set(path)) == len(path):
                world = {"people": people, "fields": relations_pool + attributes,
                         "query": {"start": start, "relations": relations, "attribute": attribute}}
                prompt = _prompt(rng, start, relations, attribute)
                if _inline(difficulty):
                    prompt = _inline_prompt(prompt, people, world["fields"], start, relations, attribute)
                return {"prompt": prompt,
                        "answer": normalize(people[path[-1]][attribute]), "info": {"world": world}}
    return None


def distinct_rows(n: int, draw) -> list:
    """Up to n rows from draw() with distinct prompts (None draws skipped; gives up after 50*n draws,
    as a tiny difficulty has fewer distinct problems than asked for)."""
    rows, seen = [], set()
    for _ in range(50 * n):
        if len(rows) == n:
            break
        row = draw()
        if row is not None and row["prompt"] not in seen:
            seen.add(row["prompt"])
            rows.append(row)
    return rows


def parse_answer(text):
    found = re.findall(r"answer\s*[:=]\s*(.*)", text or "", re.IGNORECASE)
    return (normalize(found[-1]) or None) if found else None


def gold(answer):
    return normalize(answer)
