"""The semantic-cache guard: similar prompts that differ in a detail that matters.

Embeddings put "convert 5 km to miles" and "convert 50 km to miles", or "is X safe"
and "is X not safe", very close together. A candidate above the similarity
threshold is still rejected when the two prompts differ in their numbers, their
negations or their named entities (capitalized names, acronyms, identifiers,
quoted strings); also when one has a word and the other its opposite
(before/after, upload/download, formal/informal) or the same terms swap places
("Celsius to Fahrenheit" vs "Fahrenheit to Celsius"), a term changes role ("from X"
in one, "to X" in the other), two content words trade places around others ("Can a manager fire
an employee" vs "Can an employee fire a manager"), one asks for the subject and the other for
the object ("Who killed Macbeth?" vs "Who did Macbeth kill?"), or the prompts say the same
content words in the same order but one, which is not a synonym of the other ("for adults" vs
"for kids"; the synonym groups are the ``lexicon/synonyms*.txt`` files).

:func:`same_words` says the opposite: only typos, inflections and fillers differ, so the
prompts ask the same thing without a model having to say so.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections import Counter
from importlib import resources

_NUMBER_WORDS = {
    "zero": "0", "two": "2", "three": "3", "four": "4", "five": "5", "six": "6",
    "seven": "7", "eight": "8", "nine": "9", "ten": "10", "eleven": "11", "twelve": "12",
    "thirteen": "13", "fourteen": "14", "fifteen": "15", "sixteen": "16", "seventeen": "17",
    "eighteen": "18", "nineteen": "19", "twenty": "20", "thirty": "30", "forty": "40", "fifty": "50",
    "sixty": "60", "seventy": "70", "eighty": "80", "ninety": "90", "hundred": "100",
    "thousand": "1000", "million": "1000000", "billion": "1000000000", "dozen": "12",
    "half": "0.5", "double": "x2", "twice": "x2", "triple": "x3", "first": "#1", "second": "#2",
    "third": "#3", "fourth": "#4", "fifth": "#5",
}  # fmt: skip
_NEGATIONS = frozenset({
    "not", "no", "never", "none", "nobody", "nothing", "nowhere", "neither", "nor", "without",
    "cannot", "cant", "dont", "doesnt", "didnt", "isnt", "arent", "wasnt", "werent", "wont",
    "wouldnt", "shouldnt", "couldnt", "hasnt", "havent", "hadnt", "mustnt", "neednt", "avoid",
    "except", "excluding", "unlike", "non",
})  # fmt: skip
# Capitalized words that are not names: sentence starters, pronouns, question words.
_COMMON_WORDS = """
a an the i i'm i've i'd i'll me my we our you your he she it its they them their this that these those
what whats what's how hows how's why when where who whom whose which whats can could would should will
shall may might must do does did is are was were be been am have has had please tell give show explain
describe list write make create find get help let lets let's in on at for from to of by with about into
and or but if so then also just any some all every each more most less least best good new
hi hello hey thanks thank ok okay yes sure summarize summarise translate compare define calculate
convert suggest recommend name provide generate why's where's who's there here is it's
"""
_COMMON = frozenset(_COMMON_WORDS.split())

# Capitalized words too generic to name anything ("on Earth" = "in the world").
_GENERIC = frozenset({"earth", "world", "pc", "internet", "web"})
# Words whose swap flips the question: one side has one, the other side its counterpart.
_OPPOSITES = (
    ("before", "after"), ("buy", "sell"), ("key", "value"), ("keys", "values"), ("min", "max"),
    ("minimum", "maximum"), ("largest", "smallest"), ("biggest", "smallest"), ("largest", "tallest"),
    ("highest", "lowest"), ("first", "last"), ("add", "drop"), ("add", "remove"), ("open", "close"),
    ("gain", "lose"), ("start", "stop"), ("enable", "disable"), ("true", "false"), ("hot", "cold"),
    ("upper", "lower"), ("uppercase", "lowercase"), ("left", "right"), ("north", "south"), ("east", "west"),
    ("boiling", "freezing"), ("risks", "benefits"), ("pros", "cons"), ("causes", "consequences"),
    ("cheap", "expensive"), ("fast", "slow"), ("faster", "slower"), ("old", "young"), ("older", "younger"),
    ("push", "pull"), ("send", "receive"), ("import", "export"), ("input", "output"), ("read", "write"),
    ("create", "delete"), ("install", "uninstall"), ("join", "split"), ("merge", "split"),
    ("compress", "decompress"), ("zip", "unzip"), ("lock", "unlock"), ("win", "lose"), ("rise", "fall"),
)  # fmt: skip
_OPPOSITE = frozenset(frozenset(pair) for pair in _OPPOSITES)
# Prefix pairs that flip a stem: increase/decrease, upload/download, formal/informal.
_FLIP_PREFIXES = ("in", "de", "en", "up", "down", "im", "ex", "dis", "un", "non", "ir", "il", "over", "under")

_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_'.-]*[A-Za-z0-9]|[A-Za-z]")
# A number, with the "am"/"pm" of a time of day ("7am" is not "7pm"; "7 p.m." is "7pm").
_NUMBER = re.compile(r"(?<![A-Za-z])([-+]?\d[\d,]*(?:\.\d+)?%?)(?:\s?([ap])\.?m\b\.?)?", re.IGNORECASE)
# "3rd" is "third" (an ordinal), "10k" is "10,000".
_ORDINAL = re.compile(r"^(?:st|nd|rd|th)\b", re.IGNORECASE)
_THOUSANDS = re.compile(r"^k\b", re.IGNORECASE)
# "First" that ends a clause means "beforehand" ("... without telling me first?", "weights first
# or cardio first?"), not a rank: it counts as a number only when the other prompt ranks too
# ("Who finished first?" / "Who finished second?").
_BEFOREHAND = re.compile(r"\bfirst\b(?=\s*(?:[?.!,;:]|$|(?:or|and|then|before)\b))", re.IGNORECASE)
# Quoted strings, in the quotation marks of any language: straight and curly double quotes,
# backticks, guillemets, low-high quotes, corner brackets and Chinese title marks.
_QUOTED = re.compile(
    r"\"([^\"]{1,200})\"|`([^`]{1,200})`|\u201c([^\u201d]{1,200})\u201d|\u00ab([^\u00bb]{1,200})\u00bb"
    r"|\u201e([^\u201c\u201d]{1,200})[\u201c\u201d]|\u300c([^\u300d]{1,200})\u300d|\u300e([^\u300f]{1,200})\u300f"
    r"|\u300a([^\u300b]{1,200})\u300b"
)
# Languages that write every noun with a capital initial: there a capital marks no name.
NOUNS_CAPITALIZED = frozenset({"de"})
# Scripts written without spaces between words (Han, kana, Thai, Lao, Khmer, Myanmar): their
# "words" as the word rules see them are whole clauses, so those rules say nothing there.
_UNSPACED = re.compile(
    "[\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]"
)


def numbers(text: str) -> Counter[str]:
    """Numbers written as digits or words, normalized (``1,000`` = ``10k`` = ``1000``, ``five`` =
    ``5``, ``3rd`` = ``third``; ``15%`` = ``15 percent`` = ``fifteen percent``: a percent sign is
    not part of the number)."""
    found: Counter[str] = Counter()
    for match in _NUMBER.finditer(text):
        value = match.group(1).replace(",", "").lstrip("+").rstrip("%").rstrip(".")
        after = text[match.end() :]
        if not match.group(2) and value.isdigit() and _ORDINAL.match(after):
            value = "#" + value
        elif not match.group(2) and value.isdigit() and _THOUSANDS.match(after):
            value += "000"
        found[value + (match.group(2).lower() + "m" if match.group(2) else "")] += 1
    for word in re.findall(r"[a-z]+", text.lower()):
        if word in _NUMBER_WORDS:
            found[_NUMBER_WORDS[word]] += 1
    return found


def _numbers_differ(query: str, candidate: str) -> bool:
    """The prompts' numbers (:func:`numbers`) differ, a "first" that means "beforehand" aside
    where the other prompt has no rank (:data:`_BEFOREHAND`)."""
    q, c = numbers(query), numbers(candidate)
    if q == c:
        return False
    q_ranks, c_ranks = any(k.startswith("#") for k in q), any(k.startswith("#") for k in c)
    if not c_ranks:
        q -= Counter({"#1": len(_BEFOREHAND.findall(query))})
    if not q_ranks:
        c -= Counter({"#1": len(_BEFOREHAND.findall(candidate))})
    return q != c


def negations(text: str) -> int:
    """How many negation cues the text has (``n't`` contractions included)."""
    count = 0
    for word in re.findall(r"[a-z']+", text.lower()):
        plain = word.replace("'", "")
        if plain in _NEGATIONS or word.endswith("n't"):
            count += 1
    return count


def entities(text: str, language: str = "") -> set[str]:
    """Named things: capitalized or mixed-case words that are not common words, acronyms,
    identifiers with digits, underscores or dots, and quoted strings. In a language that
    capitalizes every noun (:data:`NOUNS_CAPITALIZED`: German) a capital initial says nothing, nor
    does one that starts a part of a hyphenated compound ("Netflix-Passwort")."""
    nouns_capitalized = language in NOUNS_CAPITALIZED
    found: set[str] = set()
    for match in _QUOTED.finditer(text):
        found.add(next(g for g in match.groups() if g).strip().lower())
    for match in _WORD.finditer(text):
        base = re.sub(r"'s$", "", match.group())
        lower = base.lower()
        if lower in _COMMON or lower in _NUMBER_WORDS or lower in _NEGATIONS or lower in _GENERIC:
            continue
        identifier = any(c in base for c in "_.") or any(c.isdigit() for c in base)
        parts = base.split("-") if nouns_capitalized else [base]
        if identifier or any(c.isupper() for part in parts for c in part[1:]):
            found.add(lower)
        elif nouns_capitalized:
            continue
        elif base[0].isupper() and not _starts_sentence(text, match.start()):
            # A capital that starts a sentence says nothing ("Track order 4821", "Move £50 ...").
            found.add(lower)
    return found


def _starts_sentence(text: str, at: int) -> bool:
    """Whether the word at ``at`` starts a sentence: Spanish opens a question or an exclamation
    with an inverted mark ("¿Cómo ...?"), and quotation marks or brackets may come first."""
    before = text[:at].rstrip(" \t\"'(\u00bf\u00a1\u00ab\u201c\u201e")
    return not before or before[-1] in ".!?:;\n\u3002\uff01\uff1f"


def _words(text: str) -> list[str]:
    return [
        re.sub(r"'s$", "", w) for w in re.findall(r"[a-z0-9][a-z0-9_'.-]*[a-z0-9]|[a-z0-9]", text.lower())
    ]


def _stem_flip(a: str, b: str) -> bool:
    """``a`` and ``b`` are one stem with opposing prefixes (or one has a negating prefix)."""
    for pa in ("", *_FLIP_PREFIXES):
        if not a.startswith(pa):
            continue
        for pb in ("", *_FLIP_PREFIXES):
            if pa == pb or not b.startswith(pb):
                continue
            stem = a[len(pa) :]
            if len(stem) >= 4 and stem == b[len(pb) :]:
                return True
    return False


_LEXICON_OPPOSITES: frozenset[frozenset[str]] | None = None


def _opposites() -> frozenset[frozenset[str]]:
    """The pairs above and those of ``lexicon/opposites.txt`` (two words a line)."""
    global _LEXICON_OPPOSITES
    if _LEXICON_OPPOSITES is None:
        text = resources.files("cache").joinpath("lexicon", "opposites.txt").read_text(encoding="utf-8")
        pairs = [line.split() for line in text.splitlines() if line.strip() and not line.startswith("#")]
        _LEXICON_OPPOSITES = _OPPOSITE | {frozenset(p) for p in pairs if len(p) == 2 and p[0] != p[1]}
    return _LEXICON_OPPOSITES


def contrast(query: str, candidate: str) -> str | None:
    """An opposing word pair between the two texts (before/after, upload/download), if any."""
    a, b = set(_words(query)), set(_words(candidate))
    only_a, only_b = a - b, b - a
    opposites = _opposites()
    for word in only_a:
        for other_word in only_b:
            if frozenset((word, other_word)) in opposites or _stem_flip(word, other_word):
                return f"{word}/{other_word}"
    return None


_DIRECTION = re.compile(r"([a-z0-9]+) (?:to|into|from|vs|versus|than) (?:an? |the )?([a-z0-9]+)")


def swapped(query: str, candidate: str) -> bool:
    """The two sides of a direction swap places ("X to Y" vs "Y to X")."""
    a = set(_DIRECTION.findall(query.lower()))
    b = set(_DIRECTION.findall(candidate.lower()))
    return any((y, x) in b and x != y for x, y in a)


# A word after one of these plays that role: "from X" (source), "to X" (destination), ...
_ROLE_MARKERS = {
    "from": "source", "to": "destination", "into": "destination", "than": "comparison",
    "vs": "comparison", "versus": "comparison", "by": "agent",
}  # fmt: skip
_ROLE_SKIP = frozenset({"a", "an", "the", "my", "your", "our", "their", "his", "her", "its", "this", "that"})


def _roles(text: str) -> dict[str, str]:
    """Words that follow a role marker (skipping articles and possessives), with that role."""
    words = _words(text)
    roles: dict[str, str] = {}
    for i, word in enumerate(words[:-1]):
        role = _ROLE_MARKERS.get(word)
        if role is None:
            continue
        for following in words[i + 1 : i + 4]:
            if following not in _ROLE_SKIP:
                roles.setdefault(following, role)
                break
    return roles


def roles_swapped(query: str, candidate: str) -> str | None:
    """A term changes role between the prompts: "from X" in one and "to X" in the other, or
    the two sides of "A than B" / "A to B" trade places ("is A faster than B" vs "is B
    faster than A")."""
    for x, y in ((query, candidate), (candidate, query)):
        rx, ry = _roles(x), _roles(y)
        wx, wy = set(_words(x)), set(_words(y))
        for word, role in rx.items():
            if word in ry and ry[word] != role:
                return f"{word!r} is the {role} in one and the {ry[word]} in the other"
            if word in wy and word not in ry:
                # The other prompt gives this role to a word that the first has without it.
                taken = [w for w, r in ry.items() if r == role and w in wx and w not in rx]
                if taken:
                    return f"{word!r} and {taken[0]!r} trade the {role} role"
    return None


def reject_reason(query: str, candidate: str, language: str = "") -> str | None:
    """Why ``candidate`` must not answer ``query`` despite being similar, or None if it may.
    ``language`` is the prompts' (:mod:`cache.language`; the cache compares prompts of one
    language only), which says what a capital initial means (:func:`entities`)."""
    if _numbers_differ(query, candidate):
        return "numbers differ"
    if negations(query) != negations(candidate):
        return "negation differs"
    # An entity of one prompt must occur in the other, in any casing ("Python" = "python") and
    # accents ("Pokémon" = "Pokemon"), or spelt out there ("JS" = "JavaScript").
    q, c = _unaccented(query), _unaccented(candidate)
    lost_q = {e for e in entities(q, language) if not _named(e, q, c)}
    lost_c = {e for e in entities(c, language) if not _named(e, c, q)}
    missing = sorted(lost_q | lost_c)
    if missing:
        return "named entities differ: " + ", ".join(missing[:3])
    flipped = contrast(query, candidate)
    if flipped is not None:
        return "opposite terms: " + flipped
    if swapped(query, candidate):
        return "same terms in a different order"
    roles = roles_swapped(query, candidate)
    if roles is not None:
        return "roles swapped: " + roles
    traded = exchanged(query, candidate)
    if traded is not None:
        return "roles swapped: {!r} and {!r} trade places".format(*traded)
    if subject_and_object_swapped(query, candidate):
        return "roles swapped: one asks for the subject, the other for the object"
    changed = changed_word(query, candidate)
    if changed is not None and not synonyms(*changed):
        return "one word changed: {}/{}".format(*changed)
    return None


def _one_edit(a: str, b: str) -> bool:
    """``a`` and ``b`` differ by at most one inserted, deleted or replaced letter."""
    if abs(len(a) - len(b)) > 1:
        return False
    if len(a) > len(b):
        a, b = b, a
    i = 0
    while i < len(a) and a[i] == b[i]:
        i += 1
    return a[i + (len(a) == len(b)) :] == b[i + 1 :]


def _unaccented(text: str) -> str:
    """``text`` without accents on Latin letters ("Pokémon" -> "Pokemon", "café" -> "cafe")."""
    if text.isascii():
        return text
    return "".join(ch for ch in unicodedata.normalize("NFKD", text) if not unicodedata.combining(ch))


def _named(entity: str, own: str, other: str) -> bool:
    """``entity`` (of ``own``) is named in ``other``: mentioned (:func:`_mentions`), written
    with other dots or hyphens ("U.S." = "US", "Wi-Fi" = "wifi"), or one is the other's
    abbreviation: "JS" in one and "JavaScript" in the other, "ER" and "emergency room", "2FA"
    and "two-factor authentication"; "United" of "United States" and "US"."""
    if _mentions(other, entity):
        return True
    plain = re.sub(r"[.-]", "", entity)
    if plain in _undotted_words(other):
        return True
    if plain in _initials(other):
        return True
    # The other side's abbreviation: in capitals there, or of three letters or a digit and no
    # common word in lower case ("iac", "ww2"; "us" may be the pronoun).
    capitals = {w.lower() for w in re.findall(r"\b[A-Z0-9]{2,6}\b", other)}
    spelt = _initials(own)
    return any(
        entity in spelt.get(w, ())
        for w in _words(other)
        if w in capitals or (w not in _COMMON and (len(w) >= 3 or any(c.isdigit() for c in w)))
    )


# This and _initials are asked of the same two prompts once per entity of either: each is
# computed once per prompt (cached; what they return is read, never changed).
@functools.lru_cache(maxsize=64)
def _undotted_words(text: str) -> frozenset[str]:
    """The words of ``text`` without their dots and hyphens ("U.S." -> "US", "Wi-Fi" -> "WiFi")."""
    return frozenset(re.sub(r"[.-]", "", w) for w in _words(text))


_ROMAN = {"ii": "2", "iii": "3", "iv": "4", "vi": "6", "vii": "7", "viii": "8", "ix": "9"}


@functools.lru_cache(maxsize=64)
def _initials(text: str) -> dict[str, frozenset[str]]:
    """The initials of each run of two to six words of ``text`` (camelCase and hyphens split
    words; a number word, a digit or a Roman numeral gives its digit), with the run's words:
    "United States" -> "us", "JavaScript" -> "js", "two-factor authentication" -> "2fa",
    "World War II" -> "ww2". A run never starts or ends on a common word ("use Salesforce" is
    no "US")."""
    tokens: list[tuple[str, str]] = []  # (initial, the word as _words gives it)
    for word in re.findall(r"[A-Za-z0-9]+", text):
        for part in re.findall(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|[0-9]", word):
            low = part.lower()
            roman = part.isupper() and low in _ROMAN
            head = _ROMAN[low] if roman else _NUMBER_WORDS.get(low, low)[0]
            tokens.append((head, word.lower()))
    found: dict[str, frozenset[str]] = {}
    for start in range(len(tokens)):
        for end in range(start + 2, min(start + 6, len(tokens)) + 1):
            run = tokens[start:end]
            if run[0][1] in _COMMON or run[-1][1] in _COMMON:
                continue
            key = "".join(head for head, _ in run)
            found[key] = found.get(key, frozenset()) | {w for _, w in run}
    return found


def _mentions(text: str, entity: str) -> bool:
    """``entity`` occurs in ``text``, also as its plural or singular, or misspelled by one letter
    (a word of at least five letters: "Mondys" is "Mondays"; "Java" is not "Jana")."""
    if " " in entity or not entity.isascii():  # a phrase, or a quoted name in another script
        return entity in text.lower()
    words = set(_words(text))
    if entity in words or entity + "s" in words or entity.removesuffix("s") in words:
        return True
    return len(entity) >= 5 and any(len(w) >= 5 and _one_edit(entity, w) for w in words)


# Greetings, apologies and thanks around a question do not change what it asks.
_OPENERS = re.compile(
    r"^(?:(?:(?:hi|hello|hey|hiya|heya|greetings|good (?:morning|afternoon|evening)|dear \w+)"
    r"(?: there| all| team)?"
    r"|(?:sorry|apologies)(?:,? (?:silly|quick|stupid|dumb|simple|basic) question)?(?:,? but)?"
    r"|(?:quick|silly|simple|basic) question|please|pls|excuse me)[\s,.!:;-]+"
    # A bare "Morning" or "Quick one" only before punctuation ("Morning sickness" is a question).
    r"|(?:morning|afternoon|evening|quick one)\s?[,.!:;-][\s,.!:;-]*)",
    re.IGNORECASE,
)
_CLOSERS = re.compile(
    r"[\s,.!;-]+(?:thanks(?: a lot| so much| in advance)?|thank you(?: (?:so|very) much| in advance)?|thx|ty"
    r"|cheers|many thanks|much appreciated|appreciate it|please|pls)[\s.!]*$",
    re.IGNORECASE,
)


def core_question(text: str) -> str:
    """``text`` without the greetings, apologies and thanks around it ("Hi! How do I X? Thanks"
    -> "How do I X?"); the text itself when nothing else would be left."""
    core = text.strip()
    while True:
        trimmed = _CLOSERS.sub("", _OPENERS.sub("", core, count=1), count=1).strip()
        if trimmed == core or not trimmed:
            break
        core = trimmed
    return core[:1].upper() + core[1:] if core and core != text.strip() else core


# What ``same_words`` passes over: articles, prepositions, the present-tense verbs and subject
# pronouns of asking ("how do I", "can you"), and the fillers of speech. Question words, modal
# verbs that change the question (should, must, will), the past tense (was, did: "who was" is
# not "who is") and every other pronoun are kept; "me"/"my" and "your" keep who is meant
# ("Can you send me ..." is not "Can I send you ...").
_PASSED_OVER = frozenset(
    {
        "a", "an", "the", "of", "to", "in", "on", "at", "for", "with", "and", "or", "is", "are", "be",
        "being", "am", "do", "does", "can", "could", "i", "you", "its", "there", "here", "this", "that",
        "these", "those", "as", "by", "about", "into", "so", "just", "um", "uh", "er", "erm", "hmm", "ah",
        "oh", "ok", "okay", "please", "pls", "kindly", "actually", "basically", "really", "quick",
        "question", "like", "sorry", "hey", "hi", "hello", "thanks", "thank",
    }
)  # fmt: skip
# The asking around a question ("could you tell me how ..."), dropped before the words compare.
_ASKING = re.compile(
    r"\b(?:(?:can|could|would|will) you (?:please )?(?:tell|show|let) me"
    r"|(?:do|does) (?:you|anyone) know|i(?:'d| would) like to know|i (?:want|need) to know"
    r"|i was wondering|i wonder)\b",
    re.IGNORECASE,
)
_PERSON = {
    "me": "1p", "my": "1p", "mine": "1p", "myself": "1p", "your": "2p", "yours": "2p", "yourself": "2p",
}  # fmt: skip
# Contractions that read as a word of their own once the apostrophe is gone.
_CONTRACTED = {
    "whats": "what", "hows": "how", "wheres": "where", "whos": "who", "whens": "when", "whys": "why",
    "cant": "cannot",
}  # fmt: skip
_INFLECTIONS = ("ing", "es", "s", "ed")


def _content_words(text: str) -> list[str]:
    plain = _ASKING.sub(" ", text.replace("\u2019", "'")).lower().replace("'", "")
    words = [_CONTRACTED.get(w, w) for w in re.findall(r"[^\W_]+", plain)]
    return [_PERSON.get(w, w) for w in words if w not in _PASSED_OVER]


def _stem(word: str) -> str:
    for ending in _INFLECTIONS:
        if word.endswith(ending) and len(word) - len(ending) >= 3:
            return word[: -len(ending)]
    return word


def _typo(a: str, b: str) -> bool:
    """One letter inserted, deleted or replaced, or two neighbours swapped, in words of at
    least four letters ("cancle" is "cancel", "instal" is "install"). Not when a digit is
    involved ("sheet1"/"sheet2") or both are words of ``lexicon/words.txt``: then the change
    made another word ("employer"/"employee", "form"/"from"), unless the two are one word's
    British and American spellings ("colour"/"color")."""
    if min(len(a), len(b)) < 4 or not (a.isalpha() and b.isalpha()):
        return False
    words = _dictionary()
    if a in words and b in words:
        return _spelling(a) == _spelling(b)
    if len(a) == len(b):
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        if len(diff) == 2:
            i, j = diff
            return j == i + 1 and a[i] == b[j] and a[j] == b[i]
        return len(diff) == 1
    return _one_edit(a, b)


def same_words(query: str, candidate: str) -> bool:
    """The prompts say the same content words in the same order: they differ only in the words
    ``_PASSED_OVER`` lists, in inflection (plural, -ing, -ed) and in typos. English only (the
    word lists and endings are English); the guard (:func:`reject_reason`) still has to pass.
    Word order counts, so "Alice owes Bob" is never "Bob owes Alice" here."""
    return _unalike(query, candidate) == []


def _alike(a: str, b: str) -> bool:
    return a == b or _stem(a) == _stem(b) or _inflected(a, b) or _typo(a, b)


def _inflected(a: str, b: str) -> bool:
    """One word is the other with a regular ending ("virus"/"viruses", "grape"/"grapes",
    "city"/"cities", "cancel"/"canceling"), which :func:`_stem` alone can miss ("viruses" ->
    "virus" but "virus" -> "viru")."""
    short, long_ = sorted((a, b), key=len)
    if len(short) < 3:
        return False
    forms = {short + "s", short + "ed", short + "ing"}
    if short.endswith(("s", "x", "z", "ch", "sh", "o")):
        forms.add(short + "es")
    if short.endswith("e"):
        forms |= {short + "d", short[:-1] + "ing"}
    if short.endswith("y"):
        forms |= {short[:-1] + "ies", short[:-1] + "ied"}
    return long_ in forms


# British endings and their American spelling; each needs three or more letters before it, so a
# short word is never taken for another ("four" is not "for", "filled" is not "filed").
_BRITISH = tuple(
    (re.compile(pattern), american)
    for pattern, american in (
        (r"(?<=[a-z]{3})our(s|ed|ing|ite|ites|ful|able)?$", r"or\1"),
        (r"(?<=[a-z]{3})is(e|es|ed|ing|ation|ations)$", r"iz\1"),
        (r"(?<=[a-z]{3})ys(e|es|ed|ing)$", r"yz\1"),
        (r"(?<=[a-z]{3}[aeiou])ll(ed|ing|er|ers)$", r"l\1"),
        (r"(?<=[a-z]{3})tre(s)?$", r"ter\1"),
        (r"(?<=[a-z]{3})ogue(s)?$", r"og\1"),
        (r"(?<=[a-z]{3})ence(s)?$", r"ense\1"),
    )
)


def _spelling(word: str) -> str:
    """``word`` with a British ending spelt the American way ("colour" -> "color",
    "organise" -> "organize", "cancelled" -> "canceled", "centre" -> "center")."""
    for pattern, american in _BRITISH:
        word = pattern.sub(american, word)
    return word


_WORDS: frozenset[str] | None = None


def _dictionary() -> frozenset[str]:
    """The words of ``lexicon/words.txt`` (four letters or more)."""
    global _WORDS
    if _WORDS is None:
        text = resources.files("cache").joinpath("lexicon", "words.txt").read_text(encoding="utf-8")
        _WORDS = frozenset(w for w in text.split("\n") if w and not w.startswith("#"))
    return _WORDS


def _unalike(query: str, candidate: str) -> list[tuple[str, str]] | None:
    """The content words that differ, position by position; None when the counts differ (or
    there are none), or when either prompt is in a script written without spaces."""
    if _UNSPACED.search(query) or _UNSPACED.search(candidate):
        return None
    a, b = _content_words(query), _content_words(candidate)
    if not a or len(a) != len(b):
        return None
    return [(x, y) for x, y in zip(a, b, strict=True) if not _alike(x, y)]


SYNONYM_FILES = ("synonyms.txt", "synonyms-project.txt")
_SYNONYMS: dict[str, frozenset[int]] | None = None


def _synonym_groups() -> dict[str, frozenset[int]]:
    """Each word of the ``lexicon/`` synonym files with the groups (lines) it belongs to."""
    global _SYNONYMS
    if _SYNONYMS is None:
        groups: dict[str, set[int]] = {}
        lines: list[str] = []
        lexicon = resources.files("cache").joinpath("lexicon")
        for name in SYNONYM_FILES:
            lines += lexicon.joinpath(name).read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines):
            if line.strip() and not line.startswith("#"):
                for word in line.split():
                    groups.setdefault(word, set()).add(number)
        _SYNONYMS = {word: frozenset(found) for word, found in groups.items()}
    return _SYNONYMS


def synonyms(a: str, b: str) -> bool:
    """``a`` and ``b`` (or their stems) share a group of the ``lexicon/`` synonym files."""
    groups = _synonym_groups()
    for x in {a, _stem(a)}:
        for y in {b, _stem(b)}:
            if groups.get(x, frozenset()) & groups.get(y, frozenset()):
                return True
    return False


def exchanged(query: str, candidate: str) -> tuple[str, str] | None:
    """Two content words trade places and every other stays where it was, with at least one
    word between them: "Can a manager fire an employee without notice?" / "Can an employee
    fire a manager without notice?", "Is a square a kind of rectangle?" / "Is a rectangle a
    kind of square?". Who does what to whom changes with no marker word
    (:func:`roles_swapped` needs "from", "to", "than", ...). Neighbours that trade places
    ("the Git commit" / "the commit in Git") are left to the verifier: a paraphrase often
    reorders a compound that way. In a script written without spaces: two stretches of at most
    :data:`SPAN_CHARACTERS` characters trade places around text that stays
    (:func:`_exchanged_spans`)."""
    if _UNSPACED.search(query) or _UNSPACED.search(candidate):
        return _exchanged_spans(query, candidate)
    a, b = _content_words(query), _content_words(candidate)
    if len(a) != len(b):
        return None
    differ = [k for k in range(len(a)) if not _alike(a[k], b[k])]
    if len(differ) != 2:
        return None
    i, j = differ
    if j - i >= 2 and _alike(a[i], b[j]) and _alike(a[j], b[i]):
        return (a[i], a[j])
    return None


_WH_WORDS = ("who", "whom", "what", "which")
_AUXILIARIES = ("did", "does", "do", "will", "would", "can", "could", "should", "has", "have", "had")
_OBJECT_QUESTION = re.compile(
    rf"^\W*({'|'.join(_WH_WORDS)})(?:\s+\w+)?\s+(?:{'|'.join(_AUXILIARIES)})\b", re.IGNORECASE
)
_SUBJECT_QUESTION = re.compile(rf"^\W*({'|'.join(_WH_WORDS)})\b", re.IGNORECASE)
_QUESTION_WORDS = frozenset(_WH_WORDS + _AUXILIARIES)


def subject_and_object_swapped(query: str, candidate: str) -> bool:
    """One asks for the subject and the other for the object, with the same content words:
    "Who killed Macbeth?" / "Who did Macbeth kill?", "What attacked the bear?" / "What did the
    bear attack?". English marks the object question with an auxiliary after the question word.
    Regular inflections only ("kill"/"killed"; "eat"/"ate" is two words here)."""
    for x, y in ((query, candidate), (candidate, query)):
        asks_object, asks_subject = _OBJECT_QUESTION.match(x), _SUBJECT_QUESTION.match(y)
        if asks_object is None or asks_subject is None or _OBJECT_QUESTION.match(y):
            continue
        if asks_object.group(1).lower().removesuffix("m") != asks_subject.group(1).lower().removesuffix("m"):
            continue
        words_x = Counter(_stem(w) for w in _content_words(x) if w not in _QUESTION_WORDS)
        words_y = Counter(_stem(w) for w in _content_words(y) if w not in _QUESTION_WORDS)
        if words_x and words_x == words_y:
            return True
    return False


def changed_word(query: str, candidate: str) -> tuple[str, str] | None:
    """The one content word that differs when the prompts otherwise say the same content words
    in the same order ("Is breakfast included for adults?" / "... for kids?"), else None. In a
    script written without spaces: the one stretch of text that differs (:func:`_changed_span`)."""
    if _UNSPACED.search(query) or _UNSPACED.search(candidate):
        return _changed_span(query, candidate)
    changed = _unalike(query, candidate)
    return changed[0] if changed is not None and len(changed) == 1 else None


SPAN_CHARACTERS = 6


def _differing(query: str, candidate: str) -> tuple[str, str, int]:
    """The stretches of two prompts (punctuation and spaces dropped) between their common
    beginning and end, and the length of those two together."""
    a = re.sub(r"[\W_]+", "", query.lower())
    b = re.sub(r"[\W_]+", "", candidate.lower())
    prefix = 0
    while prefix < min(len(a), len(b)) and a[prefix] == b[prefix]:
        prefix += 1
    suffix = 0
    while suffix < min(len(a), len(b)) - prefix and a[-1 - suffix] == b[-1 - suffix]:
        suffix += 1
    return a[prefix : len(a) - suffix], b[prefix : len(b) - suffix], prefix + suffix


def _exchanged_spans(query: str, candidate: str) -> tuple[str, str] | None:
    """Two stretches that trade places with text between them that stays: "what time is it in
    New York at 10 in Beijing" and the other way round, in Chinese."""
    x, y, _ = _differing(query, candidate)
    if len(x) != len(y) or not x:
        return None
    for first in range(1, min(SPAN_CHARACTERS, len(x) - 1) + 1):
        for last in range(1, min(SPAN_CHARACTERS, len(x) - first - 1) + 1):
            u, middle, v = x[:first], x[first : len(x) - last], x[len(x) - last :]
            if u != v and y == v + middle + u:
                return (u, v)
    return None


def _changed_span(query: str, candidate: str) -> tuple[str, str] | None:
    """The stretches that differ when two prompts are one text but for a stretch of at most
    :data:`SPAN_CHARACTERS` characters on each side, with at least as much text around it in
    common ("\u5317\u4eac\u5230**\u4e0a\u6d77**\u7684\u9ad8\u94c1\u7968" / "... **\u5e7f\u5dde** ..."): a word
    replaced, as far as can be told without a dictionary of the script's words; else None."""
    x, y, common = _differing(query, candidate)
    if not x or not y or max(len(x), len(y)) > SPAN_CHARACTERS or common < max(len(x), len(y)):
        return None
    return (x, y)
