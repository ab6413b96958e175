"""string_pipeline's tool interface, shipped read-only into the workspace: `import task_tools as tt`.

    SYSTEM_PROMPT           the task's system prompt (the inline one when task.json sets inline: true)
    Environment             the task's tools: get_record(record_id), transform(text, op, arg), reading
                            info["world"] = {"records": {id: text}, "record_id"}
    make_tools(world)       the same tools as plain functions over one world: the hidden eval's own
    task_difficulty()       task.json's knobs: n_transforms, min_length, max_length, ops, max_shift,
                            n_records, inline
    make_row(rng, d)        one row {prompt, answer, info: {"world"}} at knobs d; unset knobs: 2-4
                            transforms of 10-16 character strings
    distinct_rows(n, draw)  up to n rows with distinct prompts from draw()
    parse_answer(text)      the last 'Answer: <string>' (quotes and spaces around it dropped), or None
    gold(answer)            the row's answer as parse_answer returns it
"""

import json
import random
import re
import string
from pathlib import Path

TOOL_SYSTEM_PROMPT = (
    "You are a careful assistant that transforms strings with tools. First call "
    "get_record with the record id from the question to fetch its text. Then apply "
    "each requested step in order with one transform call, passing the previous "
    "result as text. When done, reply with the final line 'Answer: <string>', "
    "copying the last result exactly (case matters)."
)
INLINE_SYSTEM_PROMPT = (
    "You are a careful assistant that transforms strings. The question states the record's "
    "text, so you do not need get_record. Apply each requested step in order, starting from "
    "that text. The tools are optional, but transform gives exact results: call it once per "
    "step, passing the previous result as text. When done, reply with the final line "
    "'Answer: <string>', copying the final result exactly (case matters)."
)
INLINE_REMINDER = " End your reply with the line 'Answer: <string>'."  # closes an inline question

OPS = ["reverse", "upper", "lower", "rotate_left", "rotate_right", "replace", "drop_vowels", "every_other",
       "caesar", "sort_chars", "dedupe"]
NUMERIC_OPS = {"rotate_left", "rotate_right", "caesar"}
VOWELS = set("aeiouAEIOU")
ALPHABET = string.ascii_letters + string.digits
MAX_TEXT = 200
MAX_PIECE = 10
PHRASES = {
    "reverse": ["reverse it", "write it backwards"],
    "upper": ["convert it to uppercase", "make every letter uppercase"],
    "lower": ["convert it to lowercase", "make every letter lowercase"],
    "rotate_left": ["rotate it left by {n}", "move its first {n} characters to the end"],
    "rotate_right": ["rotate it right by {n}", "move its last {n} characters to the front"],
    "replace": ["replace every '{a}' with '{b}'", "change each '{a}' into '{b}'"],
    "drop_vowels": ["remove the vowels", "drop every vowel"],
    "every_other": ["keep every other character, starting with the first",
                    "take the characters at even positions (0, 2, 4, ...)"],
    "caesar": ["apply a Caesar shift of {n}", "shift every letter {n} places forward in the alphabet"],
    "sort_chars": ["sort its characters", "arrange its characters in ASCII order"],
    "dedupe": ["remove repeated characters, keeping the first of each", "delete duplicate characters"],
}


def _parse_int(arg):
    if isinstance(arg, bool):
        return None
    if isinstance(arg, int):
        return arg
    if isinstance(arg, str) and re.fullmatch(r"[+-]?\d{1,6}", arg.strip()):
        return int(arg.strip())
    return None


def _unquote(s):
    s = s.strip()
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "'\"`":
        s = s[1:-1]
    return s


def _parse_replace(arg):
    if not isinstance(arg, str) or "->" not in arg:
        return None
    old, new = arg.split("->", 1)
    old, new = _unquote(old), _unquote(new)
    if not old or len(old) > MAX_PIECE or len(new) > MAX_PIECE:
        return None
    return old, new


def _caesar(text, n):
    out = []
    for c in text:
        if "a" <= c <= "z":
            out.append(chr((ord(c) - 97 + n) % 26 + 97))
        elif "A" <= c <= "Z":
            out.append(chr((ord(c) - 65 + n) % 26 + 65))
        else:
            out.append(c)
    return "".join(out)


def apply_transform(text, op, arg):
    if op == "reverse":
        return text[::-1]
    if op == "upper":
        return text.upper()
    if op == "lower":
        return text.lower()
    if op in NUMERIC_OPS:
        n = _parse_int(arg)
        if n is None:
            return f"error: {op} needs arg = a whole number as text, e.g. '3'; got {arg!r}"
        if op == "caesar":
            return _caesar(text, n)
        if not text:
            return text
        k = n % len(text)
        return text[k:] + text[:k] if op == "rotate_left" else text[len(text) - k:] + text[:len(text) - k]
    if op == "replace":
        pair = _parse_replace(arg)
        if pair is None:
            return f"error: replace needs arg 'A->B' (A non-empty, each at most {MAX_PIECE} chars); got {arg!r}"
        out = text.replace(*pair)
        return out if len(out) <= MAX_TEXT else f"error: result longer than {MAX_TEXT} characters"
    if op == "drop_vowels":
        return "".join(c for c in text if c not in VOWELS)
    if op == "every_other":
        return text[::2]
    if op == "sort_chars":
        return "".join(sorted(text))
    if op == "dedupe":
        return "".join(dict.fromkeys(text))
    return f"error: unknown op {op!r}; ops: {', '.join(OPS)}"


def _transform(text, op, arg):
    """Check a transform call's arguments, then apply it (an 'error:' text, never an exception)."""
    if isinstance(text, int) and not isinstance(text, bool):
        text = str(text)
    if not isinstance(text, str):
        return f"error: text must be a string, got {type(text).__name__}"
    if len(text) > MAX_TEXT:
        return f"error: text longer than {MAX_TEXT} characters"
    if not isinstance(op, str):
        return f"error: op must be a string, one of: {', '.join(OPS)}"
    op = op.strip().lower().replace("-", "_").replace(" ", "_")
    return apply_transform(text, op, "" if arg is None else arg)


# ---------------------------------------------------------------- tools


def make_tools(world):
    """The task's tools over one world, as plain functions: the hidden eval's own
    (ait.families.string_pipeline returns these, and the eval's chat template shows their docstrings)."""
    records = dict(world.get("records") or {})

    def get_record(record_id: str) -> str:
        """Fetch the stored text of a record by its id.

        Args:
            record_id: The record id from the question, e.g. "R7".

        Returns:
            The record's text, or a line starting with "error:".
        """
        if not isinstance(record_id, str) or not record_id.strip():
            return "error: record_id must be a non-empty string such as 'R7'"
        key = record_id.strip().upper()
        if key not in records:
            return f"error: unknown record {record_id!r}; known: {', '.join(sorted(records))}"
        return records[key]

    def transform(text: str, op: str, arg: str) -> str:
        """Apply one string transform and return the new text.

        Args:
            text: The text to transform (the record or the previous result).
            op: One of reverse, upper, lower, rotate_left, rotate_right, replace, drop_vowels, every_other, caesar, sort_chars, dedupe.
            arg: The op's argument: N for rotate_left, rotate_right and caesar (e.g. "3"); "A->B" for replace; "" for the others.

        Returns:
            The transformed text, or a line starting with "error:".
        """
        return _transform(text, op, arg)

    return [get_record, transform]


class Environment:
    """make_tools' tools as methods over a row's info["world"]: what env.py's trainer calls, and the
    docstrings its prompts show."""

    def reset(self, info: dict) -> None:
        world = (info or {}).get("world") or {}
        self.records = dict(world.get("records") or {})  # for code that reads them
        self._tools = {fn.__name__: fn for fn in make_tools(world)}

    def _tool(self, name):
        if not hasattr(self, "_tools"):  # a tool called before reset acts on an empty world
            self._tools = {fn.__name__: fn for fn in make_tools({})}
        return self._tools[name]

    def get_record(self, record_id: str) -> str:
        """Fetch the stored text of a record by its id.

        Args:
            record_id: The record id from the question, e.g. "R7".
        """
        return self._tool("get_record")(record_id)

    def transform(self, text: str, op: str, arg: str) -> str:
        """Apply one string transform and return the new text.

        Args:
            text: The text to transform (the record or the previous result).
            op: One of reverse, upper, lower, rotate_left, rotate_right, replace, drop_vowels, every_other, caesar, sort_chars, dedupe.
            arg: The op's argument: N for rotate_left, rotate_right and caesar (e.g. "3"); "A->B" for replace; "" for the others.
        """
        return self._tool("transform")(text, op, arg)


def task_difficulty() -> dict:
    """The task's difficulty knobs from task.json next to this file ({} when it is not there).
    Training at another difficulty teaches the wrong problems: at an easy rung the model would
    only ever see chains it cannot finish, and learn the shaped rewards instead of the answer."""
    try:
        difficulty = json.loads(Path(__file__).with_name("task.json").read_text()).get("difficulty", {})
    except (OSError, ValueError, AttributeError):
        return {}
    return difficulty if isinstance(difficulty, dict) else {}


def _inline(difficulty):
    """Whether the task states the record's text in the question (knob "inline", false by default)."""
    flag = difficulty.get("inline", False)
    return flag is True or (isinstance(flag, str) and flag.strip().lower() == "true")


SYSTEM_PROMPT = INLINE_SYSTEM_PROMPT if _inline(task_difficulty()) else TOOL_SYSTEM_PROMPT


def _knob(difficulty, name, lo, hi):
    """An integer knob clamped to [lo, hi], or None when the task does not set it (or garbles it)."""
    try:
        return min(max(int(difficulty[name]), lo), hi)
    except (KeyError, TypeError, ValueError):
        return None


def _ops(difficulty):
    """The task's allowed ops (a list, or a comma-separated string); all of them by default."""
    ops = difficulty.get("ops")
    if isinstance(ops, str):
        ops = ops.split(",")
    ops = [o.strip() for o in ops if isinstance(o, str)] if isinstance(ops, (list, tuple)) else []
    return [o for o in OPS if o in ops] or list(OPS)


def _step(rng, value, ops, max_shift):
    """One (phrase, result) that changes the string and keeps it non-empty, using the allowed ops."""
    fallback = None
    for _ in range(40):
        op = rng.choice(ops)
        template = rng.choice(PHRASES[op])
        if op in NUMERIC_OPS:
            n = rng.randint(1, max_shift)
            arg, phrase = str(n), template.format(n=n)
        elif op == "replace":
            a = rng.choice(sorted(set(value)))
            b = rng.choice([c for c in ALPHABET if c != a])
            arg, phrase = f"{a}->{b}", template.format(a=a, b=b)
        else:
            arg, phrase = "", template
        out = apply_transform(value, op, arg)
        if out and out != value:
            return phrase, out
        if fallback is None and out and ops != OPS:
            fallback = (phrase, out)  # a restricted op set may have no changing step: stay within it
    return fallback or ("reverse it", value[::-1])


def make_row(rng: random.Random, difficulty: dict) -> dict:
    """One problem at the task's knobs (the family's meaning: n_transforms steps after the fetch,
    record strings of min_length..max_length characters, steps drawn from ops, rotations and
    Caesar shifts of 1..max_shift, n_records records in the world, the record's text in the
    question when inline); a knob the task leaves out keeps this env's own range."""
    n_records = _knob(difficulty, "n_records", 1, 20) or 4
    lo = _knob(difficulty, "min_length", 1, 40) or 10
    hi = max(_knob(difficulty, "max_length", 1, 40) or 16, lo)
    ops = _ops(difficulty)
    max_shift = _knob(difficulty, "max_shift", 1, 25) or 5
    n_transforms = _knob(difficulty, "n_transforms", 1, 10)
    ids = rng.sample(range(1, 100), n_records)
    records = {f"R{i}": "".join(rng.choice(ALPHABET) for _ in range(rng.randint(lo, hi))) for i in ids}
    target = f"R{rng.choice(ids)}"
    value, phrases = records[target], []
    for _ in range(rng.randint(2, 4) if n_transforms is None else n_transforms):
        phrase, value = _step(rng, value, ops, max_shift)
        phrases.append(phrase)
    chain = ", then ".join(phrases)
    prompt = f"Take record {target}. {chain[0].upper()}{chain[1:]}. What is the resulting string?"
    if _inline(difficulty):
        prompt = (f'Take record {target}, whose text is "{records[target]}". {chain[0].upper()}{chain[1:]}. '
                  f"What is the resulting string?{INLINE_REMINDER}")
    return {"prompt": prompt, "answer": value, "info": {"world": {"records": records, "record_id": target}}}


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
    found = re.findall(r"answer\**\s*[:=]\**[ \t]*([^\n]*)", text or "", re.IGNORECASE)
    if not found:
        return None
    got = found[-1].strip().strip(" \t\r\n\"'`")
    return got or None


def gold(answer):
    return answer
