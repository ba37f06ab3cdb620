#!/usr/bin/env python3
"""Build the chat corpus for the embedded default model (scratchy-tiny) from Princeton WordNet 3.0.

Source: the Debian package `wordnet-base` (/usr/share/wordnet/{index,data}.{noun,verb,adj,adv});
license: WordNet 3.0 license (permissive; see /usr/share/doc/wordnet-base/copyright and the model card).
Python 3 standard library only.

Every WordNet headword (lemma) yields a few question/answer conversations:
  definition  "What is a telescope?"             -> "A telescope is a magnifier of images of distant objects."
  meaning     "What does 'ephemeral' mean?"      -> "The word 'ephemeral' means lasting a very short time."
  verb        "What does it mean to run?"        -> "To run is to move fast by using one's feet, ..."
  example     "Give an example of 'x' in a sentence." -> a WordNet example sentence that uses the word
  synonym     "What is a synonym of 'x'?"        -> other lemmas of the same synset
  antonym     "What is the opposite of 'x'?"     -> WordNet's lexical antonym
  kind        "What kind of thing is a telescope?" -> "A telescope is a kind of magnifier."
Question wordings vary (chosen by a hash of the headword, so the output is deterministic).
About 2 % of headwords (by a hash of the headword) are held out: none of their conversations is
trained on. A few demo headwords are always kept in training (DEMO_WORDS).

Output (JSON lines, one conversation each: {"messages": [...], "repeat": n, "kind": k, "headword": h}):
  OUTDIR/train.jsonl.gz, OUTDIR/heldout.jsonl.gz, OUTDIR/meta.json

Usage: python3 tools/corpus/make_corpus.py OUTDIR [--wordnet /usr/share/wordnet] [--heldout-permille 20]
"""
import argparse
import gzip
import hashlib
import json
import os
import re
import sys

POS_FILES = {"n": "noun", "v": "verb", "a": "adj", "r": "adv"}
POS_NAMES = {"n": "noun", "v": "verb", "a": "adjective", "s": "adjective", "r": "adverb"}
# Used in the README / model card, so they must be answered from training data.
DEMO_WORDS = {"telescope", "ephemeral", "computer", "dog", "river", "music", "bread", "happy",
              "run", "quickly", "library", "planet", "teacher", "ocean", "piano"}
SYSTEM_PROMPT = "You are Scratchy, a small assistant that explains English words."
IDENTITY = [
    ("Who are you?", "I am Scratchy, a small language model trained on WordNet definitions. "
                     "Ask me what an English word means."),
    ("What can you do?", "I can explain English words: ask me what a word means, for a synonym, "
                         "or for an example sentence."),
    ("Hello!", "Hello! Ask me about an English word, for example: What is a telescope?"),
    ("Hi", "Hello! Ask me about an English word, for example: What does 'ephemeral' mean?"),
    ("What are you?", "I am Scratchy, a small language model that answers questions about English words."),
]


def stable_hash(text):
    return int.from_bytes(hashlib.sha1(text.encode("utf-8")).digest()[:8], "big")


def pick(options, key):
    """Deterministic choice; the first option is the canonical wording and comes up most often."""
    h = stable_hash(key) % 100
    if h < 55 or len(options) == 1:
        return options[0]
    return options[1 + h % (len(options) - 1)]


class Synset:
    __slots__ = ("offset", "pos", "words", "pointers", "definitions", "examples")

    def __init__(self, offset, pos, words, pointers, definitions, examples):
        self.offset, self.pos, self.words, self.pointers = offset, pos, words, pointers
        self.definitions, self.examples = definitions, examples


def split_gloss(gloss):
    """'def one; def two; "example one"; "example two"' -> ([defs], [examples])."""
    examples = [e.strip() for e in re.findall(r'"([^"]+)"', gloss)]
    rest = re.sub(r'"[^"]*"', "", gloss)
    defs = [d.strip().rstrip(":,").strip() for d in rest.split(";")]
    return [d for d in defs if d], [e for e in examples if e]


def surface(word):
    """WordNet spelling -> display text: underscores to spaces, adjective markers (a)/(p)/(ip) dropped."""
    return re.sub(r"\((a|p|ip)\)$", "", word).replace("_", " ")


def read_data(path, pos):
    synsets = {}
    with open(path, encoding="latin-1") as f:
        for line in f:
            if line.startswith("  "):  # license header
                continue
            head, _, gloss = line.partition(" | ")
            fields = head.split()
            offset, ss_type = fields[0], fields[2]
            n_words = int(fields[3], 16)
            words = [surface(fields[4 + 2 * i]) for i in range(n_words)]
            at = 4 + 2 * n_words
            n_ptrs = int(fields[at])
            pointers = []
            for i in range(n_ptrs):
                sym, target, tpos, srctgt = fields[at + 1 + 4 * i: at + 5 + 4 * i]
                pointers.append((sym, target, tpos, int(srctgt[:2], 16), int(srctgt[2:], 16)))
            defs, examples = split_gloss(gloss.strip())
            synsets[(pos, offset)] = Synset(offset, ss_type, words, pointers, defs, examples)
    return synsets


def read_index(path, pos):
    """lemma -> (offsets most frequent first, number of senses seen in the tagged SemCor corpus)."""
    index = {}
    with open(path, encoding="latin-1") as f:
        for line in f:
            if line.startswith("  "):
                continue
            fields = line.split()
            lemma, synset_cnt, p_cnt = fields[0], int(fields[2]), int(fields[3])
            tagsense_cnt = int(fields[5 + p_cnt])
            offsets = fields[6 + p_cnt: 6 + p_cnt + synset_cnt]
            index[lemma] = (offsets, tagsense_cnt)
    return index


def article(noun_phrase, definition):
    """'a'/'an' when the definition reads like a countable noun ('a magnifier ...'), else none."""
    if noun_phrase[:1].isupper():
        return ""
    d = re.sub(r"^\([^)]*\)\s*", "", definition).lower()
    if re.match(r"(a|an|any|one|someone|something|somebody)\b", d):
        return "an" if re.match(r"[aeiou]", noun_phrase.lower()) and not noun_phrase.lower().startswith(("uni", "eu", "one", "use")) else "a"
    return ""


def with_article(art, phrase):
    return (art + " " + phrase) if art else phrase


def cap(text):
    return text[:1].upper() + text[1:]


def sentence(text):
    text = text.strip()
    return text if text.endswith((".", "!", "?")) else text + "."


def definition_text(syn, max_parts=2):
    return "; ".join(syn.definitions[:max_parts])


def uses_word(example, word):
    """Does the example sentence use the word (allowing simple inflections like -s, -ed, -ing)?"""
    ex = example.lower()
    for part in word.lower().split():
        stem = part if len(part) <= 4 else part[:len(part) - 2]
        if not re.search(r"(?<![a-z])" + re.escape(stem), ex):
            return False
    return True


def conversations_for(word, entries, data):
    """entries: list of (pos, offsets, tagsense_cnt) for this headword. Yields (kind, question, answer)."""
    key = word
    by_pos = {pos: (offsets, tagged) for pos, offsets, tagged in entries}
    # Surface spelling (keeps capitals of proper nouns) from the synset that lists the lemma.
    display = next((w for pos, offsets, _ in entries for w in data[(pos, offsets[0])].words
                    if w.lower() == word), word)

    if "n" in by_pos:
        syn = data[("n", by_pos["n"][0][0])]
        d = definition_text(syn)
        if d:
            art = article(display, syn.definitions[0])
            subject = with_article(art, display)
            q = pick(["What is {s}?", "What's {s}?", "Define {w}.", "Can you tell me what {s} is?",
                      "what is {s}", "Explain what {s} is."], key + "#def").format(s=subject, w=display)
            yield "definition", q, sentence(cap(subject) + " is " + d)
            hypers = [p for p in syn.pointers if p[0] == "@"]
            if hypers:
                h = data[("n", hypers[0][1])]
                hw = h.words[0]
                hart = "an" if re.match(r"[aeiou]", hw.lower()) else "a"
                q = pick(["What kind of thing is {s}?", "What type of thing is {s}?"], key + "#kind")
                yield "kind", q.format(s=subject), sentence(cap(subject) + " is a kind of " + hw)

    if "v" in by_pos:
        syn = data[("v", by_pos["v"][0][0])]
        d = definition_text(syn)
        if d:
            q = pick(["What does it mean to {w}?", "What does '{w}' mean as a verb?",
                      "Explain the verb '{w}'."], key + "#verb").format(w=display)
            yield "verb", q, sentence("To " + display + " is to " + d)

    # "What does 'x' mean?": the most common sense of each part of speech.
    parts = []
    for pos, offsets, _ in entries:
        syn = data[(pos, offsets[0])]
        if not syn.definitions:
            continue
        d = syn.definitions[0]
        if pos == "v":
            d = "to " + d
        parts.append((POS_NAMES[pos], d))
    if parts:
        q = pick(["What does '{w}' mean?", "What is the meaning of '{w}'?", "What does the word '{w}' mean?",
                  "Define the word '{w}'.", "Meaning of '{w}'?"], key + "#mean").format(w=display)
        if len(parts) == 1:
            a = sentence("The word '" + display + "' means " + parts[0][1])
        else:
            a = "The word '" + display + "' has more than one use. " + " ".join(
                sentence(("As " + ("an " if name[0] in "aeiou" else "a ") + name + ", it means " + d))
                for name, d in parts)
        yield "meaning", q, a

    # Example sentence, synonyms and antonyms come from the first sense that has them.
    example = None
    synonyms = []
    antonym = None
    for pos, offsets, _ in entries:
        for off in offsets[:3]:
            syn = data[(pos, off)]
            if example is None:
                example = next((e for e in syn.examples if uses_word(e, display)), None)
            if not synonyms:
                synonyms = [w for w in syn.words if w.lower() != word][:3]
            if antonym is None:
                my_index = next((i + 1 for i, w in enumerate(syn.words) if w.lower() == word), 0)
                for sym, target, tpos, src, tgt in syn.pointers:
                    if sym == "!" and src == my_index:
                        tsyn = data[(tpos if tpos != "s" else "a", target)]
                        antonym = tsyn.words[tgt - 1] if 0 < tgt <= len(tsyn.words) else None
                        break
    if example:
        q = pick(["Give an example of '{w}' in a sentence.", "Use '{w}' in a sentence.",
                  "Can you give me an example sentence with '{w}'?"], key + "#ex").format(w=display)
        yield "example", q, "Here is an example: \"" + sentence(cap(example)) + "\""
    if synonyms:
        q = pick(["What is a synonym of '{w}'?", "What is another word for '{w}'?",
                  "Give me a synonym for '{w}'."], key + "#syn").format(w=display)
        if len(synonyms) == 1:
            a = "A synonym of '" + display + "' is '" + synonyms[0] + "'."
        else:
            quoted = ["'" + s + "'" for s in synonyms]
            a = "Synonyms of '" + display + "' include " + ", ".join(quoted[:-1]) + " and " + quoted[-1] + "."
        yield "synonym", q, a
    if antonym:
        q = pick(["What is the opposite of '{w}'?", "What is an antonym of '{w}'?"], key + "#ant").format(w=display)
        yield "antonym", q, "The opposite of '" + display + "' is '" + antonym + "'."


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--wordnet", default="/usr/share/wordnet")
    ap.add_argument("--heldout-permille", type=int, default=20)
    ap.add_argument("--system-percent", type=int, default=5,
                    help="share of conversations that start with a system message")
    ap.add_argument("--two-turn-percent", type=int, default=4,
                    help="share of conversations with a second question about another word")
    ap.add_argument("--common-repeat", type=int, default=5,
                    help="how many times conversations about common (SemCor-tagged) words repeat per epoch")
    a = ap.parse_args()

    data, index = {}, {}
    for pos, name in POS_FILES.items():
        data_path = os.path.join(a.wordnet, "data." + name)
        index_path = os.path.join(a.wordnet, "index." + name)
        if not (os.path.exists(data_path) and os.path.exists(index_path)):
            sys.exit("WordNet database not found in %s (apt-get install wordnet-base)" % a.wordnet)
        data.update(read_data(data_path, pos))
        for lemma, (offsets, tagged) in read_index(index_path, pos).items():
            index.setdefault(lemma.replace("_", " "), []).append((pos, offsets, tagged))
    # Satellite adjectives live in data.adj with type 's'; the index refers to them as 'a'.

    train, heldout = [], []
    counts = {}
    for word in sorted(index):
        # Most used part of speech first (senses seen in the tagged corpus), then noun, verb, adj, adv.
        entries = sorted(index[word], key=lambda e: -e[2])
        # Common words (senses seen in the tagged SemCor corpus, ~20k headwords) are what people ask
        # about, so they are trained COMMON_REPEAT times as often as the ~120k rare ones.
        repeat = a.common_repeat if any(tagged > 0 for _, _, tagged in entries) else 1
        is_heldout = (word not in DEMO_WORDS and stable_hash("heldout:" + word) % 1000 < a.heldout_permille)
        for kind, q, ans in conversations_for(word, entries, data):
            conv = {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": ans}],
                    "repeat": repeat, "kind": kind, "headword": word}
            (heldout if is_heldout else train).append(conv)
            counts[kind] = counts.get(kind, 0) + 1

    # A few conversations with a system prompt, and a few with two turns, so that these shapes of the
    # chat template are not new to the model at serving time.
    mixed = []
    for i, conv in enumerate(train):
        h = stable_hash("shape:%d" % i) % 100
        if h < a.system_percent:
            conv = dict(conv, messages=[{"role": "system", "content": SYSTEM_PROMPT}] + conv["messages"])
        elif h < a.system_percent + a.two_turn_percent:
            other = train[stable_hash("other:%d" % i) % len(train)]
            conv = dict(conv, messages=conv["messages"] + other["messages"], kind=conv["kind"] + "+2turn")
        mixed.append(conv)
    train = mixed
    for q, ans in IDENTITY:
        train.append({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": ans}],
                      "repeat": 40, "kind": "identity", "headword": ""})

    os.makedirs(a.outdir, exist_ok=True)
    for name, rows in (("train.jsonl.gz", train), ("heldout.jsonl.gz", heldout)):
        # mtime=0 keeps the compressed bytes identical from run to run.
        with open(os.path.join(a.outdir, name), "wb") as raw, \
                gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
            for row in rows:
                gz.write((json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8"))
    heldout_words = sorted({c["headword"] for c in heldout})
    meta = {"source": "Princeton WordNet 3.0 (Debian wordnet-base)", "headwords": len(index),
            "heldout_headwords": len(heldout_words), "train_conversations": len(train),
            "heldout_conversations": len(heldout), "by_kind": counts,
            "train_conversations_weighted": sum(c["repeat"] for c in train)}
    with open(os.path.join(a.outdir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
